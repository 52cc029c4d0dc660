package formats

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"reflect"
	"slices"
	"testing"
)

// withZip64 rewrites the end of a buildTorchZip archive as CD, a zip64 end
// record (with extra bytes of extensible data), a locator if loc, and the
// end record.
func withZip64(a []byte, extra int, loc bool) []byte {
	eocd := a[len(a)-22:]
	cdSize, cdOff := binary.LittleEndian.Uint32(eocd[12:]), binary.LittleEndian.Uint32(eocd[16:])
	count := binary.LittleEndian.Uint16(eocd[10:])
	out := slices.Clone(a[:len(a)-22])
	z64 := len(out)
	le := binary.LittleEndian
	out = append(out, zip64EOCDSig...)
	out = le.AppendUint64(out, uint64(44+extra))
	out = le.AppendUint16(out, 45)
	out = le.AppendUint16(out, 45)
	out = le.AppendUint32(out, 0)
	out = le.AppendUint32(out, 0)
	out = le.AppendUint64(out, uint64(count))
	out = le.AppendUint64(out, uint64(count))
	out = le.AppendUint64(out, uint64(cdSize))
	out = le.AppendUint64(out, uint64(cdOff))
	out = append(out, make([]byte, extra)...)
	if loc {
		out = append(out, zip64LocSig...)
		out = le.AppendUint32(out, 0)
		out = le.AppendUint64(out, uint64(z64))
		out = le.AppendUint32(out, 1)
	}
	return append(out, eocd...)
}

// TestZipEndRecords: Parse walks back over the end records the Chunker
// accepts, and both refuse the ones it cannot walk (a zip64 end record
// without its locator, or with extensible data: no writer makes them).
// Found by review: Parse failed on some that the Chunker indexed.
func TestZipEndRecords(t *testing.T) {
	w := ptTensor{"w", "0", "FloatStorage", "", 4, 0, []int64{4}, []int64{1}}
	a := torchWith(stateDictPickle([]ptTensor{w}), zipMember{"0", f32s(3, 4)})
	// A 20-byte comment on the last central directory entry that starts
	// with a locator's signature, right before the end record.
	eocd, body := slices.Clone(a[len(a)-22:]), slices.Clone(a[:len(a)-22])
	last := bytes.LastIndex(body, []byte(zipCentralSig))
	comment := append([]byte(zip64LocSig), make([]byte, 16)...)
	binary.LittleEndian.PutUint16(body[last+32:], uint16(len(comment)))
	binary.LittleEndian.PutUint32(eocd[12:], binary.LittleEndian.Uint32(eocd[12:])+uint32(len(comment)))
	fakeLoc := slices.Concat(body, comment, eocd)
	if _, err := zip.NewReader(bytes.NewReader(fakeLoc), int64(len(fakeLoc))); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		data   []byte
		format string
	}{
		{"plain", a, fmtTorch},
		{"zip64", withZip64(a, 0, true), fmtTorch},
		{"distcp zip64", slices.Concat(withZip64(a, 0, true), a, withZip64(a, 0, true)), fmtDistcp},
		{"fake locator in a comment", fakeLoc, fmtTorch},
		{"distcp fake locator", slices.Concat(fakeLoc, fakeLoc), fmtDistcp},
		{"zip64 without locator", withZip64(a, 0, false), ""},
		{"zip64 extensible data", withZip64(a, 16, true), ""},
		{"distcp zip64 extensible data", slices.Concat(a, withZip64(a, 16, true)), ""},
		{"distcp zip64 without locator first", slices.Concat(withZip64(a, 0, false), a), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, cix := chunk(tc.data, 4096, 0)
			if cix.Format != tc.format {
				t.Fatalf("Chunker: format %q, want %q", cix.Format, tc.format)
			}
			pix, err := Parse(bytes.NewReader(tc.data), int64(len(tc.data)))
			if tc.format == "" {
				if err == nil && pix.Format != "" {
					t.Fatalf("Parse: format %q, the Chunker's unknown", pix.Format)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(cix, pix) {
				t.Fatalf("Parse: %v\n%+v\nChunker:\n%+v", err, pix, cix)
			}
		})
	}
}

// TestConcatenatedZips: zips of another kind one after another (cat a.zip
// a.zip) are unknown, as before distcp, not an error.
func TestConcatenatedZips(t *testing.T) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	f, err := zw.Create("hello.txt")
	if err == nil {
		_, err = f.Write([]byte("hello"))
	}
	if err == nil {
		err = zw.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	data := slices.Concat(buf.Bytes(), buf.Bytes())
	ix, err := Parse(bytes.NewReader(data), int64(len(data)))
	if err != nil || ix.Format != "" {
		t.Fatalf("Parse = %+v, %v; want unknown", ix, err)
	}
	if _, cix := chunk(data, 4096, 0); cix.Format != "" {
		t.Fatalf("Chunker: format %q, want unknown", cix.Format)
	}
}

// TestDistcpTensorCap: a distcp file whose data.pkls name a million tensors
// in two bytes each (memo references) is refused by Parse and the Chunker
// alike, instead of growing an index ~44x the file's size.
func TestDistcpTensorCap(t *testing.T) {
	refs := func(n int) []byte {
		w := ptTensor{"w", "0", "FloatStorage", "", 1, 0, []int64{1}, []int64{1}}
		var pk pkw
		pk.op(0x80, 2, ']', '(') // EMPTY_LIST, MARK
		pk.tensor(w).op('q', 0)  // BINPUT 0
		for i := 1; i < n; i++ {
			pk.op('h', 0) // BINGET 0
		}
		pk.op('e', '.') // APPENDS, STOP
		return torchWith(pk.Bytes(), zipMember{"0", f32s(1, 1)})
	}
	one := refs(maxSeqTensors / 4)
	ok := slices.Concat(one, one)
	if _, ix := chunk(ok, 1<<20, 0); ix.Format != fmtDistcp || len(ix.Tensors) != maxSeqTensors/2 {
		t.Fatalf("under the cap: format %q, %d tensors", ix.Format, len(ix.Tensors))
	}
	over := slices.Concat(one, one, one, one, refs(2))
	if _, ix := chunk(over, 1<<20, 0); ix.Format != "" {
		t.Fatalf("over the cap: the Chunker learned %q with %d tensors", ix.Format, len(ix.Tensors))
	}
	if ix, err := Parse(bytes.NewReader(over), int64(len(over))); err == nil {
		t.Fatalf("over the cap: Parse learned %q with %d tensors", ix.Format, len(ix.Tensors))
	}
}
