package main

// `ckptfs mount --metrics-addr HOST:PORT` serves /metrics in the Prometheus
// text format. The dependency is github.com/prometheus/client_golang: the
// reference implementation every Prometheus-scraped Go service uses (restic's
// rest-server, JuiceFS and gcsfuse among them). Writing the exposition format
// by hand would mean reimplementing its histograms, escaping and content
// negotiation.
//
// What is exported:
//   - every numeric figure of .ckptfs/stats.json (cas.Stats), read at each
//     scrape (gauges ckptfs_store_NAME, NAME its key in stats.json);
//   - commits, reads, chunk fetches (an object read and decoded on a cache
//     miss) and background re-encodes: counters, bytes and latency
//     histograms, updated by fusefs.Observer and cas.Observer.
//
// The instruments are the client's atomic counters and histograms; nothing on
// the read or commit path takes a lock of this file.

import (
	"context"
	"errors"
	"log"
	"net"
	"net/http"
	"reflect"
	"strings"
	"syscall"
	"time"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/fusefs"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// promMetrics implements fusefs.Observer and cas.Observer.
type promMetrics struct {
	reg *prometheus.Registry

	commits        *prometheus.CounterVec // result=ok|error
	commitBytes    prometheus.Counter
	commitSeconds  prometheus.Histogram
	reads          *prometheus.CounterVec
	readBytes      prometheus.Counter
	readSeconds    prometheus.Histogram
	fetches        *prometheus.CounterVec
	fetchBytes     prometheus.Counter
	fetchSeconds   prometheus.Histogram
	reencodes      *prometheus.CounterVec
	reencodeSecond prometheus.Histogram
}

var (
	_ fusefs.Observer = (*promMetrics)(nil)
	_ cas.Observer    = (*promMetrics)(nil)
)

func result(failed bool) string {
	if failed {
		return "error"
	}
	return "ok"
}

func newPromMetrics() *promMetrics {
	m := &promMetrics{reg: prometheus.NewRegistry()}
	f := func(c prometheus.Collector) { m.reg.MustRegister(c) }
	m.commits = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ckptfs_commits_total", Help: "Commits of changed files, by result."}, []string{"result"})
	m.commitBytes = prometheus.NewCounter(prometheus.CounterOpts{Name: "ckptfs_commit_bytes_total", Help: "Logical bytes of the files committed."})
	m.commitSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ckptfs_commit_duration_seconds", Help: "Time a commit took (close or fsync to durable).",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)})
	m.reads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ckptfs_reads_total", Help: "FUSE READ requests of regular files, by result."}, []string{"result"})
	m.readBytes = prometheus.NewCounter(prometheus.CounterOpts{Name: "ckptfs_read_bytes_total", Help: "Bytes returned by READ requests."})
	m.readSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ckptfs_read_duration_seconds", Help: "Time a READ request took.",
		Buckets: prometheus.ExponentialBuckets(0.00001, 4, 10)})
	m.fetches = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ckptfs_chunk_fetches_total", Help: "Chunks read and decoded from their objects (chunk cache misses), by result."}, []string{"result"})
	m.fetchBytes = prometheus.NewCounter(prometheus.CounterOpts{Name: "ckptfs_chunk_fetch_bytes_total", Help: "Decoded bytes of the chunks fetched."})
	m.fetchSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ckptfs_chunk_fetch_duration_seconds", Help: "Time a chunk fetch took (read, verify, decode).",
		Buckets: prometheus.ExponentialBuckets(0.00005, 4, 10)})
	m.reencodes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ckptfs_reencodes_total", Help: "Background re-encodes of chunks stored raw, by result."}, []string{"result"})
	m.reencodeSecond = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ckptfs_reencode_duration_seconds", Help: "Time one chunk's re-encode took.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)})
	for _, c := range []prometheus.Collector{m.commits, m.commitBytes, m.commitSeconds, m.reads, m.readBytes, m.readSeconds,
		m.fetches, m.fetchBytes, m.fetchSeconds, m.reencodes, m.reencodeSecond} {
		f(c)
	}
	// Both results exist from the start, so a rate() sees the first error.
	for _, v := range []*prometheus.CounterVec{m.commits, m.reads, m.fetches, m.reencodes} {
		v.WithLabelValues("ok")
		v.WithLabelValues("error")
	}
	f(collectors.NewGoCollector())
	f(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *promMetrics) Commit(d time.Duration, size int64, err error) {
	m.commits.WithLabelValues(result(err != nil)).Inc()
	if err == nil {
		m.commitBytes.Add(float64(size))
	}
	m.commitSeconds.Observe(d.Seconds())
}

func (m *promMetrics) Read(d time.Duration, n int, errno syscall.Errno) {
	m.reads.WithLabelValues(result(errno != 0)).Inc()
	m.readBytes.Add(float64(n))
	m.readSeconds.Observe(d.Seconds())
}

func (m *promMetrics) Fetch(d time.Duration, n int, err error) {
	m.fetches.WithLabelValues(result(err != nil)).Inc()
	m.fetchBytes.Add(float64(n))
	m.fetchSeconds.Observe(d.Seconds())
}

func (m *promMetrics) Reencode(d time.Duration, err error) {
	m.reencodes.WithLabelValues(result(err != nil)).Inc()
	m.reencodeSecond.Observe(d.Seconds())
}

// storeCollector exports stats.json's figures, read at each scrape: one
// gauge ckptfs_store_NAME for every numeric field of cas.Stats, NAME its
// key in stats.json (its json tag). The gauges are found by walking the
// struct (storeGaugeFields), so a figure added to stats.json is served
// without a change here; storeGaugeHelp only words its help.
type storeCollector struct {
	stats  func() (cas.Stats, error)
	gauges []storeGauge
}

// storeGauge is one ckptfs_store_* gauge: the field of cas.Stats at index
// (reflect.Value.FieldByIndex), whose stats.json key is name.
type storeGauge struct {
	name  string
	index []int
	desc  *prometheus.Desc
}

// storeGaugeHelp is the help of each ckptfs_store_* gauge, by stats.json
// key. A key missing here is still served, with a plain help
// (TestStoreGaugesHaveHelp asks for a line here).
var storeGaugeHelp = map[string]string{
	"files":                  "Files in the store's namespace.",
	"dirs":                   "Directories in the store's namespace.",
	"logical_bytes":          "Bytes of all files, as their readers see them.",
	"unique_bytes":           "Raw bytes of the distinct chunks the store holds.",
	"stored_bytes":           "Bytes of the chunk objects on disk.",
	"chunks":                 "Chunk objects the store holds.",
	"reencode_pending":       "Chunks stored raw, waiting for a background re-encode.",
	"reencode_pending_bytes": "Raw bytes of the chunks waiting for a re-encode.",
	"delta_chunks":           "Chunks stored as a delta against a base chunk.",
	"delta_waiting":          "Chunks whose delta waits for a later version: the changed chunks of each run's latest save, stored whole until the run's next save (a save deleted or moved out of its run counts no more).",
	"packs":                  "Pack objects the store holds (many small chunks in one object).",
	"pack_bytes":             "Bytes of the pack objects.",
	"packed_bytes":           "Bytes of the packs that live chunks hold (pack_bytes less this is dead chunks a collection cannot free yet).",
	"inline_chunks":          "Chunks stored inline in the catalog.",
	"inline_bytes":           "Bytes of the chunk objects stored inline in the catalog.",
	"remote_pending_bytes":   "Raw bytes of committed chunks not in the remote bucket yet (as of the last upload round).",
	"remote_uploaded_bytes":  "Object bytes this daemon uploaded to the remote bucket.",
	"remote_read_bytes":      "Object bytes this daemon fetched from the remote bucket.",
	"store_read_bytes":       "Bytes of objects read by this daemon (cache misses).",
	"chunk_size":             "Largest chunk the store cuts, in bytes.",
	"format_version":         "The store's on-disk format version.",
	"cache_bytes":            "Decoded bytes held in the chunk cache.",
}

// storeGaugeFields returns a gauge for every numeric field of cas.Stats,
// as encoding/json writes it into stats.json: an embedded struct without a
// json name contributes its fields, a field tagged "-" is left out, and a
// field's name is its json tag's (else the Go name). Fields that are not
// numbers (stats.json's "store", say) are no gauges.
func storeGaugeFields() []storeGauge {
	var gauges []storeGauge
	var walk func(t reflect.Type, index []int)
	walk = func(t reflect.Type, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			idx := append(append([]int(nil), index...), i)
			if f.Anonymous && f.Type.Kind() == reflect.Struct && name == "" {
				walk(f.Type, idx)
				continue
			}
			if !f.IsExported() {
				continue
			}
			switch f.Type.Kind() {
			case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
				reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
				reflect.Float32, reflect.Float64:
			default:
				continue
			}
			if name == "" {
				name = f.Name
			}
			help := storeGaugeHelp[name]
			if help == "" {
				help = "The store's " + name + " (stats.json)."
			}
			gauges = append(gauges, storeGauge{name: name, index: idx,
				desc: prometheus.NewDesc("ckptfs_store_"+name, help, nil, nil)})
		}
	}
	walk(reflect.TypeFor[cas.Stats](), nil)
	return gauges
}

func newStoreCollector(stats func() (cas.Stats, error)) *storeCollector {
	return &storeCollector{stats: stats, gauges: storeGaugeFields()}
}

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, g := range c.gauges {
		ch <- g.desc
	}
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	st, err := c.stats()
	if err != nil {
		for _, g := range c.gauges {
			ch <- prometheus.NewInvalidMetric(g.desc, err)
		}
		return
	}
	v := reflect.ValueOf(st)
	for _, g := range c.gauges {
		var x float64
		switch f := v.FieldByIndex(g.index); {
		case f.CanInt():
			x = float64(f.Int())
		case f.CanUint():
			x = float64(f.Uint())
		default:
			x = f.Float()
		}
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, x)
	}
}

// serve serves /metrics on ln until the returned function is called.
func (m *promMetrics) serve(ln net.Listener, fsys *fusefs.FS, logger *log.Logger) func() {
	m.reg.MustRegister(newStoreCollector(fsys.Stats))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorLog: logger}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte("ckptfs metrics: /metrics\n"))
	})
	// Bounded (listen.go): at most maxMetricsConns connections, and each
	// one ends when its client is slow to ask, slow to read or idle, so
	// that nobody holds a slot for long.
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       30 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          logger,
	}
	bounded := newBoundedListener(ln, maxMetricsConns)
	go func() {
		if err := srv.Serve(bounded); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Printf("metrics: %v", err)
		}
	}()
	logger.Printf("metrics at http://%s/metrics", ln.Addr())
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}
}
