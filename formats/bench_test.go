package formats

import (
	"bytes"
	"testing"
)

// benchChunker feeds data to a Chunker in 1 MiB writes, as the FUSE write
// path does.
func benchChunker(b *testing.B, data []byte, wantFormat string) {
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		c := NewChunker(1 << 20)
		for p := data; len(p) > 0; {
			n := min(1<<20, len(p))
			c.Write(p[:n])
			p = p[n:]
		}
		if _, ix := c.Close(); ix.Format != wantFormat {
			b.Fatalf("format %q", ix.Format)
		}
	}
}

// BenchmarkChunkerTensors is the known-format path: offset arithmetic only.
func BenchmarkChunkerTensors(b *testing.B) {
	var ts []stTensor
	for i := range 64 {
		ts = append(ts, stTensor{"layer." + string(rune('a'+i%26)) + string(rune('a'+i/26)), "BF16", []int64{1024, 1024}, randBytes(uint64(i), 2<<20)})
	}
	benchChunker(b, buildSafetensors(ts, nil), fmtSafetensors)
}

// BenchmarkChunkerCDC is the unknown-format path: FastCDC over every byte.
func BenchmarkChunkerCDC(b *testing.B) {
	benchChunker(b, randBytes(1, 128<<20), "")
}

// BenchmarkParseTorch parses a torch zip of 1500 tensors (data.pkl ~150 KB).
func BenchmarkParseTorch(b *testing.B) {
	var data []byte
	for _, s := range builtSamples(b) {
		if s.name == "torch-many" {
			data = s.data
		}
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Parse(bytes.NewReader(data), int64(len(data))); err != nil {
			b.Fatal(err)
		}
	}
}
