package formats

import (
	"archive/zip"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Zip-based formats. A torch.save file is a zip whose entries all live
// under one "<archive>/" prefix, whose first entry is <archive>/data.pkl and
// whose storages are stored (uncompressed) records <archive>/data/<key>. An
// .npz is a zip of "<name>.npy" entries. Every other zip is unknown.

// Zip signatures.
const (
	zipLocalSig   = "PK\x03\x04"
	zipCentralSig = "PK\x01\x02"
	zipEOCDSig    = "PK\x05\x06"
	zip64EOCDSig  = "PK\x06\x06"
	zipDescSig    = "PK\x07\x08"
)

// maxZipEntries caps the entries of a torch zip or npz (a torch.save file
// has one per storage plus about six).
const maxZipEntries = 1 << 20

// zipKind classifies a zip by its first entry's name: fmtTorch, fmtNPZ or "".
func zipKind(first string) (kind, prefix string) {
	if p, ok := strings.CutSuffix(first, "/data.pkl"); ok && p != "" && !strings.Contains(p, "/") {
		return fmtTorch, p + "/"
	}
	if strings.HasSuffix(first, ".npy") {
		return fmtNPZ, ""
	}
	return "", ""
}

// recInfo is the data range of a zip entry.
type recInfo struct {
	off, n int64
	stored bool // method 0: the range holds the raw bytes
}

// parseZip parses a torch zip or an npz; other zips are unknown.
func parseZip(r io.ReaderAt, size int64) (*Index, error) {
	zr, err := zip.NewReader(r, size)
	if err != nil && !errors.Is(err, zip.ErrInsecurePath) {
		return nil, errorf("zip", "%v", err)
	}
	if len(zr.File) == 0 {
		return unknownIndex(size), nil
	}
	if len(zr.File) > maxZipEntries {
		return nil, errorf("zip", "%d entries exceed %d", len(zr.File), maxZipEntries)
	}
	kind, prefix := zipKind(zr.File[0].Name)
	if kind == "" {
		return unknownIndex(size), nil
	}
	recs := make(map[string]recInfo, len(zr.File))
	for _, f := range zr.File {
		if _, dup := recs[f.Name]; dup {
			return nil, errorf(kind, "duplicate entry %q", f.Name)
		}
		off, err := f.DataOffset()
		if err != nil {
			return nil, errorf(kind, "entry %q: %v", f.Name, err)
		}
		if f.CompressedSize64 > uint64(size) || off < 0 || off > size-int64(f.CompressedSize64) {
			return nil, errorf(kind, "entry %q leaves the file", f.Name)
		}
		stored := f.Method == zip.Store && f.CompressedSize64 == f.UncompressedSize64
		recs[f.Name] = recInfo{off, int64(f.CompressedSize64), stored}
	}
	if kind == fmtTorch {
		return torchIndex(r, size, zr.File, prefix, recs)
	}
	return npzIndex(r, size, zr.File, recs)
}

// torchIndex indexes a torch.save zip.
func torchIndex(r io.ReaderAt, size int64, files []*zip.File, prefix string, recs map[string]recInfo) (*Index, error) {
	for _, f := range files {
		if !strings.HasPrefix(f.Name, prefix) {
			return nil, errorf(fmtTorch, "entry %q is outside %q", f.Name, prefix)
		}
	}
	pr := recs[prefix+"data.pkl"]
	if pr.n > maxHeaderSize {
		return nil, errorf(fmtTorch, "data.pkl of %d bytes exceeds %d", pr.n, maxHeaderSize)
	}
	if !pr.stored {
		return nil, errorf(fmtTorch, "data.pkl is compressed")
	}
	pkl, err := readRange(r, pr.off, pr.n)
	if err != nil {
		return nil, err
	}
	tp, err := loadTorchPickle(pkl)
	if err != nil {
		return nil, errorf(fmtTorch, "data.pkl: %v", err)
	}
	dataRecs := make(map[string]recInfo)
	for key := range tp.storages {
		ri, ok := recs[prefix+"data/"+key]
		if !ok {
			return nil, errorf(fmtTorch, "storage %q has no record", key)
		}
		dataRecs[key] = ri
	}
	tensors, err := torchTensors(tp, dataRecs)
	if err != nil {
		return nil, err
	}
	var data []rangeSeg
	for _, f := range files {
		key, isData := strings.CutPrefix(f.Name, prefix+"data/")
		if ri := recs[f.Name]; isData && ri.stored {
			data = append(data, rangeSeg{ri.off, ri.n, tp.dtypes[key]})
		}
	}
	segs, err := layout(fmtTorch, size, 0, KindMeta, KindMeta, data)
	if err != nil {
		return nil, err
	}
	return &Index{Format: fmtTorch, Segments: segs, Tensors: tensors}, nil
}

// torchTensors places the tensors of tp in the file, given where each
// storage record's bytes are, and checks every storage has its record.
func torchTensors(tp *torchPickle, recs map[string]recInfo) ([]Tensor, error) {
	for key, s := range tp.storages {
		ri, ok := recs[key]
		if !ok {
			return nil, errorf(fmtTorch, "storage %q has no record", key)
		}
		want, _ := s.nbytes()
		if !ri.stored || ri.n != want {
			return nil, errorf(fmtTorch, "record data/%s holds %d bytes, storage needs %d", key, ri.n, want)
		}
	}
	tensors := make([]Tensor, 0, len(tp.tensors))
	for _, nt := range tp.tensors {
		t := nt.rec
		if dtypeBits[t.dtype] == 0 || dtypeBits[t.dtype]%8 != 0 {
			continue // no whole-byte element width: cannot place it
		}
		off, n, ok := t.span()
		ri := recs[t.storage.key]
		if !ok || off > ri.n || n > ri.n-off {
			return nil, errorf(fmtTorch, "tensor %q: elements [%d,+%d) outside its storage of %d bytes", nt.name, off, n, ri.n)
		}
		tensors = append(tensors, Tensor{Name: nt.name, DType: t.dtype, Shape: t.size, Offset: ri.off + off, Length: n})
	}
	sortTensors(tensors)
	return tensors, nil
}

// npzIndex indexes an npz: each stored .npy entry's array is a data segment.
func npzIndex(r io.ReaderAt, size int64, files []*zip.File, recs map[string]recInfo) (*Index, error) {
	ix := &Index{Format: fmtNPZ}
	var data []rangeSeg
	for _, f := range files {
		ri := recs[f.Name]
		if !ri.stored || !strings.HasSuffix(f.Name, ".npy") {
			continue
		}
		h, err := readNPYHeaderAt(r, ri.off, ri.n)
		if err != nil {
			return nil, errorf(fmtNPZ, "entry %q: %v", f.Name, err)
		}
		if h.nbytes < 0 {
			continue
		}
		if h.hdrLen+h.nbytes != ri.n {
			return nil, errorf(fmtNPZ, "entry %q: header describes %d data bytes, entry has %d", f.Name, h.nbytes, ri.n-h.hdrLen)
		}
		data = append(data, rangeSeg{ri.off + h.hdrLen, h.nbytes, h.dtype})
		ix.Tensors = append(ix.Tensors, Tensor{Name: strings.TrimSuffix(f.Name, ".npy"), DType: h.dtype,
			Shape: h.shape, Offset: ri.off + h.hdrLen, Length: h.nbytes})
	}
	segs, err := layout(fmtNPZ, size, 0, KindMeta, KindMeta, data)
	if err != nil {
		return nil, err
	}
	ix.Segments = segs
	sortTensors(ix.Tensors)
	return ix, nil
}

// readNPYHeaderAt parses the .npy header of the n-byte entry at off.
func readNPYHeaderAt(r io.ReaderAt, off, n int64) (npyHeader, error) {
	want := int64(12)
	for {
		b, err := readRange(r, off, min(want, n))
		if err != nil {
			return npyHeader{}, err
		}
		h, need, err := parseNPYHeader(b)
		if err != nil {
			return h, err
		}
		if need == 0 {
			return h, nil
		}
		if int64(need) > n || int64(need) <= want && want >= n {
			return h, fmt.Errorf("truncated .npy header")
		}
		want = int64(need)
	}
}
