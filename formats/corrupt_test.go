package formats

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// stHeader builds a safetensors file from a raw JSON header and data.
func stHeader(hdr string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(hdr)))
	return append(append(b, hdr...), data...)
}

// ggufRaw builds a GGUF prefix: magic, version, counts, then body.
func ggufRaw(nTensors, nKV uint64, body ...any) []byte {
	var b bytes.Buffer
	b.WriteString(ggufMagic)
	binary.Write(&b, binary.LittleEndian, uint32(3))
	binary.Write(&b, binary.LittleEndian, nTensors)
	binary.Write(&b, binary.LittleEndian, nKV)
	for _, v := range body {
		if s, ok := v.(string); ok {
			b.WriteString(s)
			continue
		}
		binary.Write(&b, binary.LittleEndian, v)
	}
	b.Write(make([]byte, 64))
	return b.Bytes()
}

// torchWith wraps a raw data.pkl into a torch zip with the given storages.
func torchWith(pkl []byte, storages ...zipMember) []byte {
	return buildTorchZip(torchRecords("archive", pkl, storages))
}

// hostile lists broken and malicious inputs; Parse must fail with
// ErrFormat and the Chunker must fall back to CDC, without panicking or
// allocating in proportion to the numbers the input claims.
func hostile(t testing.TB) []struct {
	name string
	data []byte
} {
	type tc = struct {
		name string
		data []byte
	}
	f4 := randBytes(1, 16)
	deep := `{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"x":` + strings.Repeat("[", 200000) + strings.Repeat("]", 200000) + `}}`
	var cases []tc
	add := func(name string, data []byte) { cases = append(cases, tc{name, data}) }

	add("st/huge-header-length", append(binary.LittleEndian.AppendUint64(nil, 1<<60), `{"a":1}`...))
	huge := binary.LittleEndian.AppendUint64(nil, 1<<31)
	add("st/header-length-over-limit", append(huge, `{"a":1}`...))
	add("st/header-past-eof", append(binary.LittleEndian.AppendUint64(nil, 1000), `{"a":1}`...))
	add("st/deep-json", stHeader(deep, f4))
	add("st/not-json", stHeader(`{"a":{"dtype":"F32",`, f4))
	add("st/trailing-garbage-json", stHeader(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}} x`, f4))
	add("st/unknown-dtype", stHeader(`{"a":{"dtype":"F33","shape":[4],"data_offsets":[0,16]}}`, f4))
	add("st/wrong-size", stHeader(`{"a":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}}`, f4))
	add("st/hole", stHeader(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}}`, f4))
	add("st/overlap", stHeader(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, f4))
	add("st/duplicate", stHeader(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}}`, f4))
	add("st/shape-overflow", stHeader(`{"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,16]}}`, f4))
	add("st/negative", stHeader(`{"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}}`, f4))
	add("st/truncated-data", stHeader(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, f4[:10]))
	add("st/extra-data", stHeader(`{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, append(f4, 1)))
	add("st/metadata-not-strings", stHeader(`{"__metadata__":{"a":1},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}`, f4))
	add("st/bad-utf8", stHeader("{\"\xff\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", f4))

	add("npy/header-past-eof", []byte("\x93NUMPY\x01\x00\xff\xff{'descr'"))
	add("npy/v2-huge-header", []byte("\x93NUMPY\x02\x00\xff\xff\xff\x7f{"))
	add("npy/bad-dict", buildNPY("<f4", []int64{2}, f4[:8])[:20])
	add("npy/version", []byte("\x93NUMPY\x09\x00\x10\x00{}              \n"))
	add("npy/deep", []byte("\x93NUMPY\x01\x00\x40\x00"+strings.Repeat("(", 63)+"\n"))
	add("npy/truncated", buildNPY("<f4", []int64{4}, f4[:12]))
	add("npy/too-long", buildNPY("<f4", []int64{4}, append(f4, 0)))
	add("npy/shape-overflow", buildNPY("<f8", []int64{1 << 62, 1 << 62}, nil))

	add("gguf/huge-tensor-count", ggufRaw(1<<60, 0))
	add("gguf/huge-kv-count", ggufRaw(0, 1<<60))
	add("gguf/huge-string", ggufRaw(0, 1, uint64(1<<62), "k"))
	add("gguf/huge-array", ggufRaw(0, 1, uint64(1), "k", uint32(ggufArray), uint32(ggufString), uint64(1<<61)))
	add("gguf/nested-arrays", ggufRaw(0, 1, append([]any{uint64(1), "k"}, func() (v []any) {
		for range 10 {
			v = append(v, uint32(ggufArray), uint32(ggufArray), uint64(1))
		}
		return v
	}()...)...))
	add("gguf/bad-alignment", ggufRaw(0, 1, uint64(17), "general.alignment", uint32(ggufU32), uint32(3)))
	add("gguf/unknown-type", ggufRaw(1, 0, uint64(1), "t", uint32(1), uint64(4), uint32(4), uint64(0)))
	add("gguf/unaligned", ggufRaw(1, 0, uint64(1), "t", uint32(1), uint64(4), uint32(0), uint64(3)))
	add("gguf/ne-overflow", ggufRaw(1, 0, uint64(1), "t", uint32(3), uint64(1<<40), uint64(1<<40), uint64(1<<40), uint32(0), uint64(0)))
	add("gguf/block-remainder", ggufRaw(1, 0, uint64(1), "t", uint32(1), uint64(33), uint32(2), uint64(0)))
	add("gguf/past-eof", ggufRaw(1, 0, uint64(1), "t", uint32(1), uint64(1000), uint32(0), uint64(0)))
	add("gguf/duplicate", ggufRaw(2, 0, uint64(1), "t", uint32(1), uint64(4), uint32(0), uint64(0),
		uint64(1), "t", uint32(1), uint64(4), uint32(0), uint64(32)))
	add("gguf/overlap", ggufRaw(2, 0, uint64(1), "t", uint32(1), uint64(16), uint32(0), uint64(0),
		uint64(1), "u", uint32(1), uint64(4), uint32(0), uint64(32)))
	add("gguf/empty-tensor-past-eof", ggufRaw(1, 0, uint64(1), "t", uint32(1), uint64(0), uint32(0), uint64(1<<40)))
	add("gguf/v1", []byte("GGUF\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"))

	// torch
	okPkl := stateDictPickle([]ptTensor{{"w", "0", "FloatStorage", "", 4, 0, []int64{4}, []int64{1}}})
	add("torch/truncated", torchWith(okPkl, zipMember{"0", f4})[:300])
	add("torch/no-eocd", torchWith(okPkl, zipMember{"0", f4})[:len(torchWith(okPkl, zipMember{"0", f4}))-22])
	add("torch/missing-storage", torchWith(okPkl))
	// A torch archive followed by one that is not (distcp holds only torch
	// archives), by a truncated one, or by bytes that only start like one.
	okTorch := torchWith(okPkl, zipMember{"0", f4})
	add("distcp/then-npz", slices.Concat(okTorch, buildNPZ(t, []zipMember{{"a.npy", buildNPY("<f4", []int64{4}, f4)}}, false, false)))
	add("distcp/then-truncated", slices.Concat(okTorch, okTorch[:len(okTorch)-30]))
	add("distcp/then-broken", slices.Concat(okTorch, torchWith(okPkl)))
	add("torch/short-storage", torchWith(okPkl, zipMember{"0", f4[:12]}))
	add("torch/view-outside", torchWith(stateDictPickle([]ptTensor{{"w", "0", "FloatStorage", "", 4, 2, []int64{4}, []int64{1}}}), zipMember{"0", f4}))
	add("torch/stride-overflow", torchWith(stateDictPickle([]ptTensor{{"w", "0", "FloatStorage", "", 4, 0, []int64{1 << 40, 2}, []int64{1 << 40, 1 << 30}}}), zipMember{"0", f4}))
	var w pkw
	w.op(0x80, 2).global("os", "system").str("echo pwned").op(0x85, 'R', '.')
	add("torch/os-system", torchWith(w.Bytes()))
	w.Reset()
	w.op(0x80, 2).global("builtins", "eval").op('.')
	add("torch/eval", torchWith(w.Bytes()))
	add("torch/many-marks", torchWith(append(append([]byte{0x80, 2}, bytes.Repeat([]byte{'('}, 5000)...), '.')))
	add("torch/huge-binunicode", torchWith([]byte("\x80\x02X\xff\xff\xff\x7fabc.")))
	add("torch/huge-frame", torchWith([]byte("\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7f.")))
	add("torch/huge-long4", torchWith([]byte("\x80\x02\x8b\x00\x00\x10\x00\x01.")))
	add("torch/no-stop", torchWith([]byte("\x80\x02}")))
	add("torch/after-stop", torchWith([]byte("\x80\x02}.}")))
	add("torch/bad-opcode", torchWith([]byte("\x80\x02\xff.")))
	add("torch/odd-dict", torchWith([]byte("\x80\x02(K\x01d.")))
	add("torch/unhashable-key", torchWith([]byte("\x80\x02\x8f(C\x01a\x90.")))
	add("torch/empty-stack", torchWith([]byte("\x80\x02.")))
	// Exponential sharing: L(i+1) = [L(i), L(i)] through the memo, 64 levels.
	w.Reset()
	w.op(0x80, 2).op(']', 'q', 0)
	for i := range 64 {
		w.op(']', 'h', byte(i), 'a', 'h', byte(i), 'a', 'q', byte(i+1))
	}
	add("torch/shared-dag", torchWith(w.op('.').Bytes()))

	// zips with absurd numbers
	z := buildNPZ(t, []zipMember{{"a.npy", buildNPY("<f4", []int64{4}, f4)}}, false, false)
	bad := bytes.Clone(z)
	// central directory entry: compressed size field -> 0xFFFFFFF0
	if i := bytes.Index(bad, []byte(zipCentralSig)); i >= 0 {
		binary.LittleEndian.PutUint32(bad[i+20:], 0xFFFFFFF0)
		binary.LittleEndian.PutUint32(bad[i+24:], 0xFFFFFFF0)
	}
	add("npz/absurd-size", bad)
	bad = bytes.Clone(z)
	if i := bytes.Index(bad, []byte(zipEOCDSig)); i >= 0 {
		binary.LittleEndian.PutUint16(bad[i+8:], 0xFFFF)
		binary.LittleEndian.PutUint16(bad[i+10:], 0xFFFF)
	}
	add("npz/absurd-count", bad)
	add("npz/bad-npy", buildNPZ(t, []zipMember{{"a.npy", []byte("\x93NUMPY\x01\x00\x04\x00{}}}")}}, false, false))
	add("npz/npy-size-mismatch", buildNPZ(t, []zipMember{{"a.npy", buildNPY("<f4", []int64{5}, f4)}}, false, false))
	return cases
}

func TestHostileInputs(t *testing.T) {
	for _, c := range hostile(t) {
		t.Run(c.name, func(t *testing.T) {
			ix, err := Parse(bytes.NewReader(c.data), int64(len(c.data)))
			if !errors.Is(err, ErrFormat) {
				t.Errorf("Parse = %+v, %v; want ErrFormat", ix, err)
			} else {
				t.Log(err)
			}
			cuts, cix := chunk(c.data, 4096, 0)
			checkCuts(t, c.data, cuts, cix, 4096)
			if cix.Format != "" {
				t.Errorf("Chunker index format %q, want unknown", cix.Format)
			}
			cuts1, _ := chunk(c.data, 4096, 1)
			if fmt.Sprint(cuts1) != fmt.Sprint(cuts) {
				t.Errorf("1-byte writes cut differently")
			}
		})
	}
}

// Truncating or flipping bytes in valid files must never panic, and
// whenever Parse rejects a file the Chunker must not claim a format.
func TestMutatedSamples(t *testing.T) {
	for _, s := range allSamples(t) {
		t.Run(s.name, func(t *testing.T) {
			n := len(s.data)
			var muts [][]byte
			for _, cut := range []int{1, 9, 30, 100, n / 3, n / 2, n - 23, n - 1} {
				if cut > 0 && cut < n {
					muts = append(muts, s.data[:cut])
				}
			}
			for i := 0; i < 200 && i < n; i++ {
				m := bytes.Clone(s.data)
				m[(i*7919)%min(n, 4096)] ^= byte(1 + i%255)
				muts = append(muts, m)
			}
			for _, m := range muts {
				ix, err := Parse(bytes.NewReader(m), int64(len(m)))
				if err != nil && !errors.Is(err, ErrFormat) {
					t.Fatalf("Parse error %v does not wrap ErrFormat", err)
				}
				if err == nil {
					checkIndex(t, m, ix)
				}
				cuts, cix := chunk(m, 4096, 0)
				checkCuts(t, m, cuts, cix, 4096)
				checkIndex(t, m, cix)
				if err != nil && cix.Format != "" {
					t.Fatalf("Parse rejects a file (%v) whose stream the Chunker indexed as %q", err, cix.Format)
				}
			}
		})
	}
}

// The pickle VM's memory stays bounded at the opcode cap.
func TestPickleMemoryBound(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates a few hundred MB")
	}
	pkl := append([]byte{0x80, 2}, bytes.Repeat([]byte{'}'}, maxPickleOps-2)...)
	pkl = append(pkl, '.')
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := loadTorchPickle(pkl); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d opcodes: %d MB allocated", maxPickleOps, alloc>>20)
	if alloc > 1<<30 {
		t.Fatalf("%d MB allocated", alloc>>20)
	}
	over := append(bytes.Repeat([]byte{'}'}, maxPickleOps+1), '.')
	if _, err := loadTorchPickle(over); err == nil || !strings.Contains(err.Error(), "opcodes") {
		t.Fatalf("over the cap: %v", err)
	}
}

// A list that contains itself is walked once, not forever.
func TestTorchPickleCycle(t *testing.T) {
	data := torchWith([]byte("\x80\x02]q\x00h\x00a."))
	ix, err := Parse(bytes.NewReader(data), int64(len(data)))
	if err != nil || ix.Format != fmtTorch || len(ix.Tensors) != 0 {
		t.Fatalf("Parse = %+v, %v", ix, err)
	}
}
