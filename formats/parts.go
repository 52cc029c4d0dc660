package formats

import (
	"fmt"
	"io"
)

// Tree models and pickles (issue #29), and files of zstd frames (OCDBT data
// files; zstdframes.go), are cut by parts: a scanner follows the
// file's syntax byte by byte as it streams past (no buffering, no lookahead
// beyond a token of a few bytes) and tells the Chunker where a part (a tree,
// a pickled array's buffer) begins and ends. Bytes between those points are
// still cut by content; the part boundaries add cuts that depend only on the
// bytes of the parts before them since the last forced cut, so a tree that
// a later save keeps byte for byte keeps its chunks.

// Format names of the part formats.
const (
	fmtXGBoostJSON = "xgboost-json"
	fmtXGBoostUBJ  = "xgboost-ubj"
	fmtLightGBM    = "lightgbm"
	fmtPickle      = "pickle"
)

// Part DTypes: a part of a tree model or pickle is listed in Index.Tensors
// with one of these instead of an element type.
const (
	// DTypeTree marks one tree of a tree ensemble (XGBoost, LightGBM).
	DTypeTree = "tree"
	// DTypeBuffer marks one raw buffer of a pickle (an ndarray's bytes).
	DTypeBuffer = "buffer"
)

// IsPartFormat reports whether a format's Index.Tensors are parts (trees,
// pickle buffers; see DTypeTree, DTypeBuffer) rather than tensors.
func IsPartFormat(format string) bool {
	switch format {
	case fmtXGBoostJSON, fmtXGBoostUBJ, fmtLightGBM, fmtPickle:
		return true
	}
	return false
}

// partGroup is the least size of a chunk ending at a part boundary: parts
// smaller than that share a chunk with the parts after them (a chunk is a
// store object; 500 trees of 1 KiB must not cost 500 of them). Grouping
// counts from the last forced cut, so unchanged parts group alike in every
// save.
const partGroup = 2 << 10

// maxParts bounds the parts a part format's index holds (a tree costs its
// Tensor in memory, and "{}" is a tree): past it the scan stops and the
// rest of the file is CDC-cut.
const maxParts = 1 << 20

// closer is the bracket that closes an opening one.
func closer(open byte) byte {
	if open == '{' {
		return '}'
	}
	return ']'
}

// cutRule is what a scanner asks for at the point where it stopped.
type cutRule uint8

const (
	cutNone   cutRule = iota // it consumed all its input
	cutAlways                // a cut here (the skeleton and the parts apart)
	cutGroup                 // a cut here if the open chunk holds partGroup bytes
	cutData                  // a data segment of dataLen bytes starts here
)

// partScanner follows one part format.
type partScanner interface {
	// scan consumes a prefix of b, the next bytes of the file, and returns
	// its length and what to do there: it stops at the first point where a
	// cut may go (cutNone: it consumed all of b). cutData: the scanner
	// treats the next bytes as consumed, unseen: as many as dataLen says,
	// which also gives their element type.
	scan(b []byte) (int, cutRule, error)
	dataLen() (int64, string)
	// parts returns the parts seen so far.
	parts() []Tensor
	// complete reports whether the file may end here.
	complete() bool
}

// sniffParts returns a scanner for a part format whose file starts with b
// (at least 10 bytes when the file has them), or nil.
func sniffParts(b []byte) (partScanner, string) {
	switch {
	case len(b) >= 10 && string(b[:10]) == `{"learner"`:
		return newJSONTrees(), fmtXGBoostJSON
	case len(b) >= 10 && string(b[:10]) == "{L\x00\x00\x00\x00\x00\x00\x00\x07":
		return newUBJTrees(), fmtXGBoostUBJ
	case len(b) >= 10 && string(b[:10]) == "tree\nversi":
		return &lgbTrees{atLine: true}, fmtLightGBM
	case len(b) >= 3 && b[0] == 0x80 && b[1] >= 2 && b[1] <= 5:
		return &pickleParts{}, fmtPickle
	case sniffZstdFrames(b):
		return &zstdFrames{}, fmtZstdFrames
	}
	return nil, ""
}

// partState is a Chunker's state inside a part format.
type partState struct {
	sc     partScanner
	err    error // the scanner gave up: CDC to EOF
	group  int64
	forced bool // the last cut was a forced one (cutAlways)
}

// consumeParts hands claimed non-data bytes of a part format to the scanner
// and the cutter, and returns how many it consumed: fewer than len(b) when
// the scanner starts a data segment.
func (c *Chunker) consumeParts(b []byte) int {
	ps := c.parts
	used := 0
	for len(b) > 0 {
		n, rule, err := ps.sc.scan(b)
		if err != nil {
			ps.err = err
			c.failed = true
			n = len(b)
			rule = cutNone
		}
		c.cdc(b[:n])
		c.done += int64(n)
		used += n
		b = b[n:]
		switch rule {
		case cutAlways:
			c.emit(c.done)
			ps.forced = true
		case cutGroup:
			// The first part boundary after a forced cut ends a chunk too: the
			// bytes between the skeleton and the first part (which change
			// with the skeleton) do not take the first parts with them.
			if ps.forced || c.done-c.lastCut >= ps.group {
				c.emit(c.done)
			}
			ps.forced = false
		case cutData:
			// The rest of the run so far is metadata; a data segment follows.
			c.segs.add(c.restStart, c.done-c.restStart, c.restKind, "")
			c.claim = 0
			n, dtype := ps.sc.dataLen()
			c.claimData(n, dtype, func(c *Chunker, b []byte, eof bool) {
				c.claimRest(KindMeta, false)
			})
			if c.failed {
				c.parts = nil
				return used
			}
			if c.claim == 0 { // an empty segment
				c.claimRest(KindMeta, false)
			}
			return used
		}
		if ps.err != nil {
			c.parts = nil // b is empty: the rest of the file is CDC-cut by consume
			return used
		}
	}
	return used
}

// partName names the i-th part of kind.
func partName(kind string, i int) string { return fmt.Sprintf("%s.%d", kind, i) }

// parseParts is Parse for the part formats: their scanners stream, so it
// runs a Chunker over the file and returns what the Chunker learned. A file
// that only starts like one (a pickle that is not one, a legacy torch file
// with storages after its pickles) is unknown, never an error: the sniff
// of these formats is weak.
func parseParts(r io.ReaderAt, size int64) (*Index, error) {
	c := NewChunker(0)
	buf := make([]byte, min(size, 1<<20))
	for off := int64(0); off < size; {
		n := min(int64(len(buf)), size-off)
		if _, err := readFull(r, buf[:n], off); err != nil {
			return nil, fmt.Errorf("formats: reading at %d: %w", off, err)
		}
		c.Write(buf[:n])
		off += n
	}
	_, ix := c.Close()
	return ix, nil
}
