package main

// `ckptfs mount --metrics-addr HOST:PORT` serves /metrics in the Prometheus
// text format. The dependency is github.com/prometheus/client_golang: the
// reference implementation every Prometheus-scraped Go service uses (restic's
// rest-server, JuiceFS and gcsfuse among them). Writing the exposition format
// by hand would mean reimplementing its histograms, escaping and content
// negotiation.
//
// What is exported:
//   - the figures of .ckptfs/stats.json, read from the catalog at each scrape
//     (gauges ckptfs_store_*);
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

// storeCollector exports stats.json's figures, read at each scrape.
type storeCollector struct {
	stats func() (cas.Stats, error)
	descs map[string]*prometheus.Desc
}

var storeGauges = []struct{ name, help string }{
	{"files", "Files in the store's namespace."},
	{"dirs", "Directories in the store's namespace."},
	{"logical_bytes", "Bytes of all files, as their readers see them."},
	{"unique_bytes", "Raw bytes of the distinct chunks the store holds."},
	{"stored_bytes", "Bytes of the chunk objects on disk."},
	{"chunks", "Chunk objects the store holds."},
	{"reencode_pending", "Chunks stored raw, waiting for a background re-encode."},
	{"reencode_pending_bytes", "Raw bytes of the chunks waiting for a re-encode."},
	{"store_read_bytes", "Bytes of objects read by this daemon (cache misses)."},
	{"cache_bytes", "Decoded bytes held in the chunk cache."},
	{"chunk_size", "Largest chunk the store cuts, in bytes."},
}

func newStoreCollector(stats func() (cas.Stats, error)) *storeCollector {
	c := &storeCollector{stats: stats, descs: map[string]*prometheus.Desc{}}
	for _, g := range storeGauges {
		c.descs[g.name] = prometheus.NewDesc("ckptfs_store_"+g.name, g.help, nil, nil)
	}
	return c
}

func (c *storeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *storeCollector) Collect(ch chan<- prometheus.Metric) {
	st, err := c.stats()
	if err != nil {
		for _, d := range c.descs {
			ch <- prometheus.NewInvalidMetric(d, err)
		}
		return
	}
	v := map[string]int64{
		"files": st.Files, "dirs": st.Dirs, "logical_bytes": st.LogicalBytes, "unique_bytes": st.UniqueBytes,
		"stored_bytes": st.StoredBytes, "chunks": st.Chunks, "reencode_pending": st.ReencodePending,
		"reencode_pending_bytes": st.ReencodePendingBytes, "store_read_bytes": st.StoreReadBytes,
		"cache_bytes": st.CacheBytes, "chunk_size": int64(st.ChunkSize),
	}
	for name, d := range c.descs {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v[name]))
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
