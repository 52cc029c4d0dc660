package formats

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"sort"
	"strings"
	"testing"

	"github.com/ckptfs/ckptfs/test/testrand"
)

// This file hand-encodes sample files of every format, following what the
// real writers emit (see notes/formats.md), so tests need no Python.

// randBytes returns n deterministic pseudo-random bytes.
func randBytes(seed uint64, n int) []byte { return testrand.Bytes(seed, n) }

// stTensor is a tensor to put in a safetensors file.
type stTensor struct {
	name, dtype string // dtype as in the file: "F32", "BF16", ...
	shape       []int64
	data        []byte
}

// stOrder is the safetensors writer's dtype order (descending enum order).
var stOrder = []string{"U64", "I64", "F64", "C64", "F32", "U32", "I32", "BF16", "F16", "U16", "I16",
	"F8_E8M0", "F8_E4M3", "F8_E5M2", "I8", "U8", "F6_E3M2", "F6_E2M3", "F4", "BOOL"}

// buildSafetensors encodes tensors like safetensors' writer: sorted by
// dtype then name, packed, header JSON padded with spaces to a multiple of 8.
func buildSafetensors(ts []stTensor, meta map[string]string) []byte {
	rank := map[string]int{}
	for i, d := range stOrder {
		rank[d] = i
	}
	ts = append([]stTensor(nil), ts...)
	sort.SliceStable(ts, func(i, j int) bool {
		if rank[ts[i].dtype] != rank[ts[j].dtype] {
			return rank[ts[i].dtype] < rank[ts[j].dtype]
		}
		return ts[i].name < ts[j].name
	})
	var hdr bytes.Buffer
	hdr.WriteByte('{')
	if meta != nil {
		m, _ := json.Marshal(meta)
		fmt.Fprintf(&hdr, `"__metadata__":%s`, m)
	}
	var off int
	for i, t := range ts {
		if i > 0 || meta != nil {
			hdr.WriteByte(',')
		}
		name, _ := json.Marshal(t.name)
		shape, _ := json.Marshal(t.shape)
		if t.shape == nil {
			shape = []byte("[]")
		}
		fmt.Fprintf(&hdr, `%s:{"dtype":%q,"shape":%s,"data_offsets":[%d,%d]}`, name, t.dtype, shape, off, off+len(t.data))
		off += len(t.data)
	}
	hdr.WriteByte('}')
	for hdr.Len()%8 != 0 {
		hdr.WriteByte(' ')
	}
	var out bytes.Buffer
	binary.Write(&out, binary.LittleEndian, uint64(hdr.Len()))
	out.Write(hdr.Bytes())
	for _, t := range ts {
		out.Write(t.data)
	}
	return out.Bytes()
}

// buildNPY encodes a version 1.0 .npy file.
func buildNPY(descr string, shape []int64, data []byte) []byte {
	dims := make([]string, len(shape))
	for i, d := range shape {
		dims[i] = fmt.Sprint(d)
	}
	tuple := "(" + strings.Join(dims, ", ") + ")"
	if len(shape) == 1 {
		tuple = "(" + dims[0] + ",)"
	}
	h := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, tuple)
	for (10+len(h)+1)%64 != 0 {
		h += " "
	}
	h += "\n"
	var out bytes.Buffer
	out.WriteString(npyMagic)
	out.Write([]byte{1, 0})
	binary.Write(&out, binary.LittleEndian, uint16(len(h)))
	out.WriteString(h)
	out.Write(data)
	return out.Bytes()
}

// zipMember is a file to put in a zip.
type zipMember struct {
	name string
	data []byte
}

// buildNPZ zips .npy members. withDesc streams them (sizes in data
// descriptors, as a non-seekable writer does); otherwise sizes are in the
// local headers, as np.savez on a seekable file writes them.
func buildNPZ(t testing.TB, members []zipMember, withDesc, deflate bool) []byte {
	var buf bytes.Buffer
	w := zip.NewWriter(&buf)
	for _, m := range members {
		var err error
		switch {
		case deflate: // sizes in the local header, as Python's zipfile writes them
			var z bytes.Buffer
			fw, _ := flate.NewWriter(&z, flate.DefaultCompression)
			fw.Write(m.data)
			fw.Close()
			var f interface{ Write([]byte) (int, error) }
			f, err = w.CreateRaw(&zip.FileHeader{Name: m.name, Method: zip.Deflate, CRC32: crc32.ChecksumIEEE(m.data),
				CompressedSize64: uint64(z.Len()), UncompressedSize64: uint64(len(m.data))})
			if err == nil {
				_, err = f.Write(z.Bytes())
			}
		case withDesc:
			var f interface{ Write([]byte) (int, error) }
			f, err = w.CreateHeader(&zip.FileHeader{Name: m.name, Method: zip.Store})
			if err == nil {
				_, err = f.Write(m.data)
			}
		default:
			var f interface{ Write([]byte) (int, error) }
			f, err = w.CreateRaw(&zip.FileHeader{Name: m.name, Method: zip.Store, CRC32: crc32.ChecksumIEEE(m.data),
				CompressedSize64: uint64(len(m.data)), UncompressedSize64: uint64(len(m.data))})
			if err == nil {
				_, err = f.Write(m.data)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// buildTorchZip lays out records like PyTorch's miniz writer: streaming
// local headers (flags 0x0808, zero CRC and sizes), an "FB" extra field
// padding each record's data to a 64-byte boundary, a 16-byte data
// descriptor after each non-empty record, then the central directory.
func buildTorchZip(records []zipMember) []byte { return buildTorchZipDesc(records, false) }

// buildTorchZipDesc is buildTorchZip with 24-byte (zip64) data descriptors
// when desc64 is set, as miniz writes past 4 GiB.
func buildTorchZipDesc(records []zipMember, desc64 bool) []byte {
	var out bytes.Buffer
	type cent struct {
		name       string
		off        int64
		size       int
		crc, flags uint32
	}
	var cd []cent
	le := func(v any) { binary.Write(&out, binary.LittleEndian, v) }
	for _, r := range records {
		off := int64(out.Len())
		start := off + 30 + int64(len(r.name)) + 4
		pad := (64 - start%64) % 64
		flags := uint16(0x0800)
		if len(r.data) > 0 {
			flags |= 0x0008
		}
		out.WriteString(zipLocalSig)
		le(uint16(20))
		le(flags)
		le(uint16(0)) // method: stored
		le(uint32(0)) // time, date
		le(uint32(0)) // crc
		le(uint64(0)) // sizes
		le(uint16(len(r.name)))
		le(uint16(4 + pad))
		out.WriteString(r.name)
		out.WriteString("FB")
		le(uint16(pad))
		out.Write(bytes.Repeat([]byte{'Z'}, int(pad)))
		out.Write(r.data)
		crc := crc32.ChecksumIEEE(r.data)
		if len(r.data) > 0 {
			out.WriteString(zipDescSig)
			le(crc)
			if desc64 {
				le(uint64(len(r.data)))
				le(uint64(len(r.data)))
			} else {
				le(uint32(len(r.data)))
				le(uint32(len(r.data)))
			}
		}
		cd = append(cd, cent{r.name, off, len(r.data), crc, uint32(flags)})
	}
	cdStart := out.Len()
	for _, c := range cd {
		out.WriteString(zipCentralSig)
		le(uint16(20))
		le(uint16(20))
		le(uint16(c.flags))
		le(uint16(0))
		le(uint32(0))
		le(c.crc)
		le(uint32(c.size))
		le(uint32(c.size))
		le(uint16(len(c.name)))
		le(uint16(0)) // extra
		le(uint16(0)) // comment
		le(uint16(0)) // disk
		le(uint16(0)) // internal attrs
		le(uint32(0)) // external attrs
		le(uint32(c.off))
		out.WriteString(c.name)
	}
	cdLen := out.Len() - cdStart
	out.WriteString(zipEOCDSig)
	le(uint16(0))
	le(uint16(0))
	le(uint16(len(cd)))
	le(uint16(len(cd)))
	le(uint32(cdLen))
	le(uint32(cdStart))
	le(uint16(0))
	return out.Bytes()
}

// pkw writes pickle opcodes (protocol 2, as torch.save does).
type pkw struct{ bytes.Buffer }

func (w *pkw) op(ops ...byte) *pkw { w.Write(ops); return w }
func (w *pkw) global(mod, name string) *pkw {
	w.WriteString("c" + mod + "\n" + name + "\n")
	return w
}
func (w *pkw) str(s string) *pkw {
	w.WriteByte('X')
	binary.Write(w, binary.LittleEndian, uint32(len(s)))
	w.WriteString(s)
	return w
}
func (w *pkw) int(v int64) *pkw {
	switch {
	case v >= 0 && v < 256:
		w.Write([]byte{'K', byte(v)})
	case v >= 0 && v < 65536:
		w.WriteByte('M')
		binary.Write(w, binary.LittleEndian, uint16(v))
	case v >= -1<<31 && v < 1<<31:
		w.WriteByte('J')
		binary.Write(w, binary.LittleEndian, int32(v))
	default:
		w.Write([]byte{0x8a, 8})
		binary.Write(w, binary.LittleEndian, v)
	}
	return w
}
func (w *pkw) tuple(vs []int64) *pkw {
	w.op('(')
	for _, v := range vs {
		w.int(v)
	}
	return w.op('t')
}

// ptTensor is a tensor view in a hand-built torch checkpoint.
type ptTensor struct {
	name    string
	storage string // storage key
	class   string // storage class, e.g. "FloatStorage", or "UntypedStorage" with dtype
	dtype   string // torch dtype name for _rebuild_tensor_v3 (UntypedStorage)
	numel   int64  // storage numel (bytes for UntypedStorage)
	offset  int64
	size    []int64
	stride  []int64
}

// tensor emits a _rebuild_tensor_v2 (or v3) call.
func (w *pkw) tensor(t ptTensor) *pkw {
	if t.dtype != "" {
		w.global("torch._utils", "_rebuild_tensor_v3")
	} else {
		w.global("torch._utils", "_rebuild_tensor_v2")
	}
	w.op('(')
	w.op('(').str("storage").global("torch", t.class).str(t.storage).str("cpu").int(t.numel).op('t', 'Q')
	w.int(t.offset).tuple(t.size).tuple(t.stride).op(0x89)
	w.global("collections", "OrderedDict").op(')', 'R')
	if t.dtype != "" {
		w.global("torch", t.dtype)
	}
	return w.op('t', 'R')
}

// stateDictPickle encodes an OrderedDict state dict like torch.save.
func stateDictPickle(ts []ptTensor) []byte {
	var w pkw
	w.op(0x80, 2).global("collections", "OrderedDict").op(')', 'R', '(')
	for _, t := range ts {
		w.str(t.name).tensor(t)
	}
	w.op('u')
	w.op('}').str("_metadata").global("collections", "OrderedDict").op(')', 'R', 's', 'b', '.')
	return w.Bytes()
}

// torchRecords wraps a data.pkl and storages into torch's record list.
func torchRecords(prefix string, pkl []byte, storages []zipMember) []zipMember {
	recs := []zipMember{{prefix + "/data.pkl", pkl}, {prefix + "/.format_version", []byte("1")},
		{prefix + "/.storage_alignment", []byte("64")}, {prefix + "/byteorder", []byte("little")}}
	for _, s := range storages {
		recs = append(recs, zipMember{prefix + "/data/" + s.name, s.data})
	}
	return append(recs, zipMember{prefix + "/version", []byte("3\n")},
		zipMember{prefix + "/.data/serialization_id", []byte("1234567890123456789012345678901234567890")})
}

// ggufTensor is a tensor in a hand-built GGUF file.
type ggufTensor struct {
	name string
	typ  uint32
	ne   []uint64 // ggml order
	data []byte
}

// ggufKV is a metadata pair; v is uint32, string, or []string.
type ggufKV struct {
	key string
	v   any
}

// buildGGUF encodes a GGUF v3 file like gguf-py: tensors in order, each
// padded to the alignment.
func buildGGUF(kvs []ggufKV, ts []ggufTensor, alignment int) []byte {
	var out bytes.Buffer
	le := func(v any) { binary.Write(&out, binary.LittleEndian, v) }
	str := func(s string) { le(uint64(len(s))); out.WriteString(s) }
	out.WriteString(ggufMagic)
	le(uint32(3))
	le(uint64(len(ts)))
	le(uint64(len(kvs)))
	for _, kv := range kvs {
		str(kv.key)
		switch v := kv.v.(type) {
		case uint32:
			le(uint32(ggufU32))
			le(v)
		case string:
			le(uint32(ggufString))
			str(v)
		case []string:
			le(uint32(ggufArray))
			le(uint32(ggufString))
			le(uint64(len(v)))
			for _, s := range v {
				str(s)
			}
		}
	}
	align := func(n int) int { return (n + alignment - 1) / alignment * alignment }
	off := 0
	for _, t := range ts {
		str(t.name)
		le(uint32(len(t.ne)))
		for _, n := range t.ne {
			le(n)
		}
		le(t.typ)
		le(uint64(off))
		off = align(off + len(t.data))
	}
	out.Write(make([]byte, align(out.Len())-out.Len()))
	for _, t := range ts {
		out.Write(t.data)
		out.Write(make([]byte, align(len(t.data))-len(t.data)))
	}
	return out.Bytes()
}
