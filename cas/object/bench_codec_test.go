package object

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas/internal/tensortest"
	"github.com/ckptfs/ckptfs/formats"
)

// BenchmarkCodec measures the codecs on one core: for each data set and codec,
// the stored/raw ratio (object headers included) and the throughput of
//
//	enc-MB/s     encodeObject: codec choice, encoding, payload CRC
//	dec-MB/s     decode: payload to raw bytes (the codec alone)
//	read-MB/s    decodeObject: CRC, decode and the BLAKE3 check of the chunk ID
//
// in raw megabytes (10^6 bytes) per second of wall time, and the same per
// second of the thread's CPU time (enc-cpuMB/s, dec-cpuMB/s), which a busy
// shared machine disturbs less. Run with -cpu 1.
//
// Data sets: synthetic N(0, 0.02) tensors (bf16, fp32; 32 MiB each, so that
// chunks come from memory, not cache) in 1 MiB chunks, and the checkpoint files
// (safetensors, or any format package formats parses) named in
// CKPTFS_BENCH_FILES (comma-separated), cut as the commit path cuts them: each
// data segment in 1 MiB chunks from its first byte. A file gives one set per
// dtype ("<file>:<dtype>") and one with all its bytes ("<file>:all", headers
// included, to compare with whole-file compressors).
//
// Codecs: "bytegroup" is the encoder given each chunk's element size (what
// PutHinted picks; it falls back to zstd or raw), "zstd" the encoder without a
// hint (zstd with literal entropy coding, or raw).
func BenchmarkCodec(b *testing.B) {
	const chunk = 1 << 20 // the store's default chunk size
	sets := []benchSet{
		{name: "bf16", load: func(s *benchSet) { s.synthetic(2, tensortest.GaussBF16(32*chunk/2, 0.02, 1), chunk) }},
		{name: "fp32", load: func(s *benchSet) { s.synthetic(4, tensortest.GaussF32(32*chunk/4, 0.02, 1), chunk) }},
	}
	if env := os.Getenv("CKPTFS_BENCH_FILES"); env != "" {
		for _, path := range strings.Split(env, ",") {
			fs, err := fileSets(strings.TrimSpace(path), chunk)
			if err != nil {
				b.Fatal(err)
			}
			sets = append(sets, fs...)
		}
	}
	c, err := NewCoder()
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for i := range sets {
		set := &sets[i]
		for _, codec := range []string{"bytegroup", "zstd"} {
			b.Run(set.name+"/"+codec, func(b *testing.B) {
				if set.load != nil {
					set.load(set)
					set.load = nil
				}
				hints := set.hints
				if codec == "zstd" {
					hints = make([]Hint, len(set.chunks))
				}
				benchCodec(b, c, set.chunks, hints)
			})
		}
	}
}

type benchSet struct {
	name   string
	chunks [][]byte
	hints  []Hint
	load   func(*benchSet) // fills chunks and hints on first use
}

func (s *benchSet) synthetic(elem int, data []byte, chunk int) {
	for off := 0; off < len(data); off += chunk {
		s.chunks = append(s.chunks, data[off:min(off+chunk, len(data))])
		s.hints = append(s.hints, Hint{ElemSize: elem})
	}
}

// fileSets cuts a checkpoint file into chunks: each data segment every chunk
// bytes from its first byte (hinted with its element size), the other bytes
// (headers) in chunks of at most chunk bytes, unhinted. "<file>:all" has every
// byte of the file, "<file>:<dtype>" the tensors of one dtype.
func fileSets(path string, chunk int) ([]benchSet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ix, err := formats.Parse(f, int64(len(data)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	base := filepath.Base(path)
	all := benchSet{name: base + ":all"}
	byType := map[string]*benchSet{}
	var order []string
	for _, seg := range ix.Segments {
		var h Hint
		var set *benchSet
		if seg.Kind == formats.KindData {
			if e := formats.DTypeBits(seg.DType) / 8; e == 2 || e == 4 {
				h.ElemSize = e
			}
			dt := seg.DType
			if dt == "" {
				dt = "unknown"
			}
			if set = byType[dt]; set == nil {
				set = &benchSet{name: base + ":" + dt}
				byType[dt] = set
				order = append(order, dt)
			}
		}
		for off := seg.Offset; off < seg.Offset+seg.Length; off += int64(chunk) {
			ch := data[off:min(off+int64(chunk), seg.Offset+seg.Length)]
			all.chunks = append(all.chunks, ch)
			all.hints = append(all.hints, h)
			if set != nil {
				set.chunks = append(set.chunks, ch)
				set.hints = append(set.hints, h)
			}
		}
	}
	if len(byType) == 0 {
		return nil, fmt.Errorf("%s: no tensor data (format %q)", path, ix.Format)
	}
	sets := []benchSet{all}
	for _, dt := range order {
		sets = append(sets, *byType[dt])
	}
	return sets, nil
}

func benchCodec(b *testing.B, c *Coder, chunks [][]byte, hints []Hint) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	raw := 0
	objs := make([][]byte, len(chunks))
	ids := make([]ID, len(chunks))
	for i, ch := range chunks {
		raw += len(ch)
		ids[i] = Sum(ch)
	}
	var encWall, decWall, readWall, encCPU, decCPU time.Duration
	stored := 0
	for b.Loop() {
		stored = 0
		t0, c0 := time.Now(), tensortest.ThreadCPU()
		for i, ch := range chunks {
			objs[i], _ = c.Encode(ch, hints[i])
			stored += len(objs[i])
		}
		t1, c1 := time.Now(), tensortest.ThreadCPU()
		for _, obj := range objs {
			h, _ := ParseHeader(obj)
			if _, err := c.decode(h.Codec, obj[HeaderSize:], int(h.RawLen)); err != nil {
				b.Fatal(err)
			}
		}
		t2, c2 := time.Now(), tensortest.ThreadCPU()
		for i, obj := range objs {
			if _, err := c.Decode(ids[i], obj); err != nil {
				b.Fatal(err)
			}
		}
		t3 := time.Now()
		encWall += t1.Sub(t0)
		decWall += t2.Sub(t1)
		readWall += t3.Sub(t2)
		encCPU += c1 - c0
		decCPU += c2 - c1
	}
	mbps := func(d time.Duration) float64 {
		if d <= 0 {
			return 0
		}
		return float64(raw) * float64(b.N) / d.Seconds() / 1e6
	}
	b.ReportMetric(float64(stored)/float64(raw), "ratio")
	b.ReportMetric(mbps(encWall), "enc-MB/s")
	b.ReportMetric(mbps(decWall), "dec-MB/s")
	b.ReportMetric(mbps(readWall), "read-MB/s")
	b.ReportMetric(mbps(encCPU), "enc-cpuMB/s")
	b.ReportMetric(mbps(decCPU), "dec-cpuMB/s")
	b.ReportMetric(float64(raw)/1e6, "rawMB")
}
