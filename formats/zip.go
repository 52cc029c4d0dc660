package formats

import (
	"archive/zip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
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

// maxArchives caps the torch.save archives in one distcp file (one per item
// of a rank's shard: a tensor, or a non-tensor value), and maxSeqTensors
// the tensors of all of them: a data.pkl names a tensor in two bytes (a
// memo reference), and each costs its Tensor in the index (~44x the bytes
// of such a file before the cap).
const (
	maxArchives   = 1 << 20
	maxSeqTensors = 1 << 20
)

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

// parseZip parses a torch zip, a sequence of torch zips (distcp) or an npz;
// other zips are unknown.
func parseZip(r io.ReaderAt, size int64) (*Index, error) {
	starts, walkErr := archiveStarts(r, size)
	if walkErr != nil && !errors.Is(walkErr, ErrFormat) {
		return nil, walkErr // reading failed
	}
	if len(starts) > 1 {
		return parseDistcp(r, size, starts)
	}
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
	if walkErr != nil {
		// archive/zip finds an end record followed by other bytes too, and
		// numbers it cannot account for; the Chunker accepts neither.
		return nil, errorf(kind, "%v", walkErr)
	}
	recs, err := zipRecords(zr.File, 0, size)
	if err != nil {
		return nil, errorf(kind, "%v", err)
	}
	if kind == fmtTorch {
		return torchIndex(r, size, zr.File, prefix, recs)
	}
	return npzIndex(r, size, zr.File, recs)
}

// zipRecords gives each entry of a zip of size bytes that starts at base in
// the file its data range in the file.
func zipRecords(files []*zip.File, base, size int64) (map[string]recInfo, error) {
	recs := make(map[string]recInfo, len(files))
	for _, f := range files {
		if _, dup := recs[f.Name]; dup {
			return nil, fmt.Errorf("duplicate entry %q", f.Name)
		}
		off, err := f.DataOffset()
		if err != nil {
			return nil, fmt.Errorf("entry %q: %v", f.Name, err)
		}
		if f.CompressedSize64 > uint64(size) || off < 0 || off > size-int64(f.CompressedSize64) {
			return nil, fmt.Errorf("entry %q leaves the file", f.Name)
		}
		stored := f.Method == zip.Store && f.CompressedSize64 == f.UncompressedSize64
		recs[f.Name] = recInfo{base + off, int64(f.CompressedSize64), stored}
	}
	return recs, nil
}

// torchIndex indexes a torch.save zip.
func torchIndex(r io.ReaderAt, size int64, files []*zip.File, prefix string, recs map[string]recInfo) (*Index, error) {
	tensors, data, err := torchArchive(r, files, prefix, recs)
	if err != nil {
		return nil, err
	}
	segs, err := layout(fmtTorch, size, 0, KindMeta, KindMeta, data)
	if err != nil {
		return nil, err
	}
	return &Index{Format: fmtTorch, Segments: segs, Tensors: tensors}, nil
}

// torchArchive returns the tensors of one torch.save zip and its stored
// storage records, given each entry's data range in recs.
func torchArchive(r io.ReaderAt, files []*zip.File, prefix string, recs map[string]recInfo) ([]Tensor, []rangeSeg, error) {
	for _, f := range files {
		if !strings.HasPrefix(f.Name, prefix) {
			return nil, nil, errorf(fmtTorch, "entry %q is outside %q", f.Name, prefix)
		}
	}
	pr := recs[prefix+"data.pkl"]
	if pr.n > maxHeaderSize {
		return nil, nil, errorf(fmtTorch, "data.pkl of %d bytes exceeds %d", pr.n, maxHeaderSize)
	}
	if !pr.stored {
		return nil, nil, errorf(fmtTorch, "data.pkl is compressed")
	}
	pkl, err := readRange(r, pr.off, pr.n)
	if err != nil {
		return nil, nil, err
	}
	tp, err := loadTorchPickle(pkl)
	if err != nil {
		return nil, nil, errorf(fmtTorch, "data.pkl: %v", err)
	}
	dataRecs := make(map[string]recInfo)
	for key := range tp.storages {
		ri, ok := recs[prefix+"data/"+key]
		if !ok {
			return nil, nil, errorf(fmtTorch, "storage %q has no record", key)
		}
		dataRecs[key] = ri
	}
	tensors, err := torchTensors(tp, dataRecs)
	if err != nil {
		return nil, nil, err
	}
	var data []rangeSeg
	for _, f := range files {
		key, isData := strings.CutPrefix(f.Name, prefix+"data/")
		if ri := recs[f.Name]; isData && ri.stored {
			data = append(data, rangeSeg{ri.off, ri.n, tp.dtypes[key]})
		}
	}
	return tensors, data, nil
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

// archiveStarts finds where each archive of a sequence of zips starts
// (distcp; see stepZipNext), walking back from the file's end one end
// record at a time: an archive's end records give its central directory's
// size and offset from the archive's first byte (and a zip64 locator the
// zip64 end record's), so the archive starts that far before them. It
// returns the starts in file order when the walk ends at offset 0, or an
// error wrapping ErrFormat that says why it does not (no end record ends
// the file, or one does not account for the bytes before it).
func archiveStarts(r io.ReaderAt, size int64) ([]int64, error) {
	var starts []int64
	for end := size; end > 0; {
		if len(starts) >= maxArchives {
			return nil, errorf("zip", "more than %d archives", maxArchives)
		}
		start, err := archiveStart(r, end)
		if err != nil {
			if len(starts) > 0 {
				return nil, fmt.Errorf("the archive that ends at %d (%d after it): %w", end, len(starts), err)
			}
			return nil, err
		}
		starts = append(starts, start)
		end = start
	}
	slices.Reverse(starts)
	return starts, nil
}

// archiveStart returns where the zip that ends at end starts. It tries, in
// this order, what its end record may follow (as the Chunker accepts it):
// a zip64 end record of 56 bytes and a locator naming the record's offset
// in the archive; the central directory itself (the end record's own
// numbers, unless they defer to zip64). A candidate counts only if a local
// header starts the archive and the central directory starts where the
// numbers say: a locator's signature inside an entry's comment is not
// taken for one.
func archiveStart(r io.ReaderAt, end int64) (int64, error) {
	eocd, rec, err := findEndRecord(r, end)
	if err != nil {
		return 0, err
	}
	check := func(start int64, cdOff, cdSize uint64) (bool, error) {
		if start < 0 || cdOff > uint64(end-start) || cdSize > uint64(end-start)-cdOff {
			return false, nil
		}
		b, err := readRange(r, start, 4)
		if err != nil || string(b) != zipLocalSig {
			return false, err
		}
		if cdSize == 0 {
			return true, nil
		}
		b, err = readRange(r, start+int64(cdOff), 4)
		return err == nil && string(b) == zipCentralSig, err
	}
	if eocd >= 20 {
		loc, err := readRange(r, eocd-20, 20)
		if err != nil {
			return 0, err
		}
		if string(loc[:4]) == zip64LocSig {
			z, at, err := findZip64Record(r, eocd-20)
			if err != nil {
				return 0, err
			}
			if z != nil {
				cdSize, cdOff := binary.LittleEndian.Uint64(z[40:]), binary.LittleEndian.Uint64(z[48:])
				if l := binary.LittleEndian.Uint64(loc[8:]); l <= uint64(at) {
					start := at - int64(l)
					if ok, err := check(start, cdOff, cdSize); ok || err != nil {
						return start, err
					}
				}
			}
		}
	}
	cdSize, cdOff := uint64(binary.LittleEndian.Uint32(rec[12:])), uint64(binary.LittleEndian.Uint32(rec[16:]))
	if cdSize != 0xFFFFFFFF && cdOff != 0xFFFFFFFF && cdSize+cdOff <= uint64(eocd) {
		start := eocd - int64(cdSize+cdOff)
		if ok, err := check(start, cdOff, cdSize); ok || err != nil {
			return start, err
		}
	}
	return 0, errorf("zip", "the end record at %d does not say where its archive starts", eocd)
}

// findEndRecord finds the end record that ends at end, its comment
// included: at end-22 first (torch.save writes no comment), then in the
// last 1 KiB, then in the last 64 KiB (the longest comment).
func findEndRecord(r io.ReaderAt, end int64) (int64, []byte, error) {
	for _, w := range []int64{22, 22 + 1<<10, 22 + 0xFFFF} {
		n := min(end, w)
		if n < 22 {
			break
		}
		b, err := readRange(r, end-n, n)
		if err != nil {
			return 0, nil, err
		}
		for i := len(b) - 22; i >= 0; i-- {
			if string(b[i:i+4]) == zipEOCDSig && i+22+int(binary.LittleEndian.Uint16(b[i+20:])) == len(b) {
				return end - n + int64(i), b[i : i+22], nil
			}
		}
		if n == end {
			break
		}
	}
	return 0, nil, errorf("zip", "no end record ends at %d", end)
}

// findZip64Record finds the zip64 end record that ends at end (56 bytes:
// no extensible data, as every writer leaves it and the Chunker accepts)
// and where it starts; nil if there is none.
func findZip64Record(r io.ReaderAt, end int64) ([]byte, int64, error) {
	if end < 56 {
		return nil, 0, nil
	}
	b, err := readRange(r, end-56, 56)
	if err != nil || string(b[:4]) != zip64EOCDSig || binary.LittleEndian.Uint64(b[4:]) != 44 {
		return nil, 0, err
	}
	return b, end - 56, nil
}

// parseDistcp indexes a sequence of torch.save zips that starts at each of
// starts (see stepZipNext).
func parseDistcp(r io.ReaderAt, size int64, starts []int64) (*Index, error) {
	lists := make([][]Tensor, 0, len(starts))
	var data []rangeSeg
	ntensors := 0
	for i, start := range starts {
		end := size
		if i+1 < len(starts) {
			end = starts[i+1]
		}
		n := end - start
		zr, err := zip.NewReader(io.NewSectionReader(r, start, n), n)
		if err != nil && !errors.Is(err, zip.ErrInsecurePath) {
			return nil, errorf(fmtDistcp, "archive %d at offset %d: %v", i, start, err)
		}
		if len(zr.File) == 0 || len(zr.File) > maxZipEntries {
			return nil, errorf(fmtDistcp, "archive %d at offset %d has %d entries", i, start, len(zr.File))
		}
		kind, prefix := zipKind(zr.File[0].Name)
		switch {
		case kind != fmtTorch && i == 0:
			return unknownIndex(size), nil // zips one after another, as cat makes them
		case kind != fmtTorch:
			return nil, errorf(fmtDistcp, "archive %d at offset %d is not a torch.save archive", i, start)
		}
		recs, err := zipRecords(zr.File, start, n)
		if err != nil {
			return nil, errorf(fmtDistcp, "archive %d at offset %d: %v", i, start, err)
		}
		ts, d, err := torchArchive(r, zr.File, prefix, recs)
		if err != nil {
			return nil, fmt.Errorf("archive %d at offset %d: %w", i, start, err)
		}
		if ntensors += len(ts); ntensors > maxSeqTensors {
			return nil, errorf(fmtDistcp, "more than %d tensors", maxSeqTensors)
		}
		lists = append(lists, ts)
		data = append(data, d...)
	}
	segs, err := layout(fmtDistcp, size, 0, KindMeta, KindMeta, data)
	if err != nil {
		return nil, err
	}
	return &Index{Format: fmtDistcp, Segments: segs, Tensors: archiveTensors(lists)}, nil
}

// archiveTensors names the tensors of a sequence of archives, lists[i]
// being archive i's: "k" for the bare tensor the k'th archive that holds
// tensors holds (what torch.distributed.checkpoint saves), "k.<name>" for
// a named one. The numbering is the order the writer saved its items in,
// which FileSystemWriter keeps from one save to the next of the same state,
// so a tensor keeps its name across steps (delta bases and log pair
// tensors by name). Archives without tensors (DCP's non-tensor values,
// which it writes first) are not counted: a value added to the state
// between two saves renames nothing.
func archiveTensors(lists [][]Tensor) []Tensor {
	var out []Tensor
	k := 0
	for _, ts := range lists {
		if len(ts) == 0 {
			continue
		}
		p := strconv.Itoa(k)
		k++
		for _, t := range ts {
			if t.Name == "" {
				t.Name = p
			} else {
				t.Name = p + "." + t.Name
			}
			out = append(out, t)
		}
	}
	sortTensors(out)
	return out
}
