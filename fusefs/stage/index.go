package stage

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"sort"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/formats"
	"github.com/zeebo/blake3"
)

// FileIndex is the format-specific part of a manifest (cas.Manifest.Extra):
// what formats learned about the file, with a hash per tensor.
type FileIndex struct {
	Format  string        `json:"format,omitempty"`
	Tensors []TensorEntry `json:"tensors,omitempty"`
	// TensorsOmitted counts the tensors of a file with more than
	// MaxIndexTensors: its index keeps none (Tensors is empty).
	TensorsOmitted int `json:"tensors_omitted,omitempty"`
}

// MaxIndexTensors bounds the tensors a file's index keeps. An entry costs
// ~170 bytes of catalog and several times that of memory while a commit
// builds it; real checkpoints hold thousands of tensors per file, a
// hostile one millions (a GGUF of 800k empty tensors grew the catalog by
// 136 MB and the daemon to 827 MB). Beyond the limit a file keeps its
// chunks and format but no tensor index (tensor-level diff, dedup
// reports and prefetch see no tensors), and the commit logs it.
const MaxIndexTensors = 1 << 17

// TensorEntry is one tensor of a file. Hash identifies the tensor's bytes:
// equal hashes mean equal bytes (see tensorHash).
type TensorEntry struct {
	Name   string  `json:"name"`
	DType  string  `json:"dtype"`
	Shape  []int64 `json:"shape"`
	Offset int64   `json:"offset"`
	Length int64   `json:"length"`
	Hash   string  `json:"hash"`
}

// ParseFileIndex decodes a manifest's Extra; an empty Extra is an empty index.
func ParseFileIndex(extra []byte) (*FileIndex, error) {
	var ix FileIndex
	if len(extra) == 0 {
		return &ix, nil
	}
	if err := json.Unmarshal(extra, &ix); err != nil {
		return nil, fmt.Errorf("tensor index: %w", err)
	}
	return &ix, nil
}

// buildIndex turns what formats learned into the manifest's index, hashing
// each tensor. A tensor that is a run of whole chunks costs no byte reads; a
// view into a larger data segment (a torch storage shared by several
// tensors) is named by that segment's chunks, hashed once per segment, so
// 1000 views of a 64 MiB storage read nothing either.
func buildIndex(r io.ReaderAt, fix *formats.Index, refs []cas.ChunkRef, starts []int64) (*FileIndex, error) {
	ix := &FileIndex{Format: fix.Format}
	if len(fix.Tensors) > MaxIndexTensors {
		ix.TensorsOmitted = len(fix.Tensors)
		return ix, nil
	}
	segHash := map[int64][]byte{} // data segment offset -> its chunk-run hash
	for _, t := range fix.Tensors {
		h, err := tensorHash(r, t.Offset, t.Length, fix.Segments, segHash, refs, starts)
		if err != nil {
			return nil, fmt.Errorf("hash tensor %q: %w", t.Name, err)
		}
		ix.Tensors = append(ix.Tensors, TensorEntry{
			Name: t.Name, DType: t.DType, Shape: t.Shape, Offset: t.Offset, Length: t.Length, Hash: h,
		})
	}
	return ix, nil
}

// tensorHash identifies the bytes [off, off+length). Equal hashes mean equal
// bytes, and the same tensor cut the same way hashes the same in every file:
//
//   - a range of at least formats.MinDataChunk bytes that is exactly a run
//     of whole chunks (the usual case: chunks start at tensor starts, cut by
//     one rule in every format) is the BLAKE3 of those chunks' IDs and
//     lengths;
//   - a range inside a data segment that is such a run (a view into a torch
//     storage) is the BLAKE3 of the segment's hash, the offset in it and the
//     length: equal storages and equal places mean equal bytes. segHash
//     caches segment hashes across the tensors of one file;
//   - anything else is hashed byte by byte, smaller tensors included: their
//     chunks hold container bytes around them (zip headers, neighbouring
//     tensors) and may happen to be a run in one file and not in another,
//     so only their bytes name them alike in a torch.save and in its
//     safetensors export (issue #26). Each rule hashes under its own
//     domain, so the same bytes reached by two rules hash differently.
func tensorHash(r io.ReaderAt, off, length int64, segs []formats.Segment, segHash map[int64][]byte,
	refs []cas.ChunkRef, starts []int64) (string, error) {
	small := length < formats.MinDataChunk
	if h := chunkRunHash(off, length, refs, starts); h != nil && !small {
		return fmt.Sprintf("%x", h), nil
	}
	if seg, ok := dataSegment(segs, off, length); ok && !small {
		sh, cached := segHash[seg.Offset]
		if !cached {
			sh = chunkRunHash(seg.Offset, seg.Length, refs, starts)
			segHash[seg.Offset] = sh
		}
		if sh != nil {
			h := blake3.New()
			h.Write([]byte("ckptfs tensor view v1\x00"))
			h.Write(sh)
			var n [16]byte
			binary.LittleEndian.PutUint64(n[:], uint64(off-seg.Offset))
			binary.LittleEndian.PutUint64(n[8:], uint64(length))
			h.Write(n[:])
			return fmt.Sprintf("%x", h.Sum(nil)), nil
		}
	}
	h := blake3.New()
	h.Write([]byte("ckptfs tensor bytes v1\x00"))
	buf := make([]byte, min(length, readBlock))
	for pos := int64(0); pos < length; {
		n := min(int64(len(buf)), length-pos)
		if err := readFull(r, buf[:n], off+pos); err != nil {
			return "", err
		}
		h.Write(buf[:n])
		pos += n
	}
	return fmt.Sprintf("%x", h.Sum(nil)), nil
}

// chunkRunHash returns the hash of [off, off+length) if it is exactly a run of
// whole chunks, else nil.
func chunkRunHash(off, length int64, refs []cas.ChunkRef, starts []int64) []byte {
	first := searchStarts(starts, off)
	if first < 0 || starts[first] != off {
		return nil
	}
	end := off
	i := first
	for ; i < len(refs) && end < off+length; i++ {
		end += int64(refs[i].Len)
	}
	if end != off+length {
		return nil
	}
	h := blake3.New()
	h.Write([]byte("ckptfs tensor chunks v1\x00"))
	var n [8]byte
	for _, c := range refs[first:i] {
		binary.LittleEndian.PutUint64(n[:], uint64(c.Len))
		h.Write(n[:])
		h.Write(c.ID[:])
	}
	return h.Sum(nil)
}

// dataSegment returns the data segment holding [off, off+length), if any.
// segs are sorted by offset and do not overlap.
func dataSegment(segs []formats.Segment, off, length int64) (formats.Segment, bool) {
	i := sort.Search(len(segs), func(i int) bool { return segs[i].Offset > off }) - 1
	if i < 0 {
		return formats.Segment{}, false
	}
	s := segs[i]
	if s.Kind != formats.KindData || off+length > s.Offset+s.Length {
		return formats.Segment{}, false
	}
	return s, true
}

// searchStarts returns the index of the last start ≤ off, or -1.
func searchStarts(starts []int64, off int64) int {
	lo, hi := 0, len(starts)
	for lo < hi {
		mid := (lo + hi) / 2
		if starts[mid] <= off {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo - 1
}

// IndexFile cuts a file the way a commit through the mount would and returns
// its chunks (hashed, not stored) and tensor index. The CLI uses it on files
// outside any mount.
func IndexFile(ctx context.Context, r io.ReaderAt, size int64, chunkSize int) ([]cas.ChunkRef, *FileIndex, error) {
	refs, ix, _, err := ingest(ctx, fixedSource{r, size}, formats.NewChunker(chunkSize), func(_ context.Context, data []byte, _ string, _ int64) (cas.ChunkRef, error) {
		return cas.ChunkRef{ID: cas.Sum(data), Len: uint32(len(data))}, nil
	})
	return refs, ix, err
}
