package fusefs

import (
	"context"
	"io"

	"github.com/ckptfs/ckptfs/cas"
	"github.com/ckptfs/ckptfs/fusefs/stage"
)

// FileIndex is the format-specific part of a manifest (cas.Manifest.Extra):
// what formats learned about the file, with a hash per tensor (stage.FileIndex).
type FileIndex = stage.FileIndex

// TensorEntry is one tensor of a file (stage.TensorEntry).
type TensorEntry = stage.TensorEntry

// MaxIndexTensors bounds the tensors a file's index keeps (stage.MaxIndexTensors).
const MaxIndexTensors = stage.MaxIndexTensors

// DefaultWriteMemory is the memory all streams together may hold (WithWriteMemory).
const DefaultWriteMemory = stage.DefaultWriteMemory

// ParseFileIndex decodes a manifest's Extra; an empty Extra is an empty index.
func ParseFileIndex(extra []byte) (*FileIndex, error) { return stage.ParseFileIndex(extra) }

// IndexFile cuts a file the way a commit through the mount would and returns
// its chunks (hashed, not stored) and tensor index. The CLI uses it on files
// outside any mount.
func IndexFile(ctx context.Context, r io.ReaderAt, size int64, chunkSize int) ([]cas.ChunkRef, *FileIndex, error) {
	return stage.IndexFile(ctx, r, size, chunkSize)
}
