package test

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// normalWeights returns n float32 samples of N(0, 0.02) as little-endian
// fp32, or bf16 (the top half of each) when bf16 is set.
func normalWeights(seed int64, n int, bf16 bool) []byte {
	rng := rand.New(rand.NewSource(seed))
	width := 4
	if bf16 {
		width = 2
	}
	out := make([]byte, n*width)
	for i := 0; i < n; i++ {
		bits := math.Float32bits(float32(rng.NormFloat64() * 0.02))
		if bf16 {
			binary.LittleEndian.PutUint16(out[2*i:], uint16(bits>>16))
		} else {
			binary.LittleEndian.PutUint32(out[4*i:], bits)
		}
	}
	return out
}

// TestTensorCompressionThroughMount is the compression issue's check: 256 MiB
// of N(0, 0.02) weights in a safetensors file written through the mount keeps
// stored_bytes / unique_bytes <= 0.68 for bf16 and <= 0.85 for fp32, once the
// chunks a busy commit stored raw have been re-encoded in the background.
func TestTensorCompressionThroughMount(t *testing.T) {
	for _, c := range []struct {
		dtype string
		bf16  bool
		limit float64
	}{{"BF16", true, 0.68}, {"F32", false, 0.85}} {
		t.Run(c.dtype, func(t *testing.T) {
			store, mnt := filepath.Join(t.TempDir(), "store"), t.TempDir()
			d := startDaemon(t, store, mnt)
			const tensorBytes = 8 << 20
			var tensors []stTensor
			for i := 0; i < 256<<20/tensorBytes; i++ {
				width := 4
				if c.bf16 {
					width = 2
				}
				tensors = append(tensors, stTensor{
					name: fmt.Sprintf("layers.%02d.weight", i), dtype: c.dtype,
					shape: []int64{int64(tensorBytes / width)},
					data:  normalWeights(int64(i+1), tensorBytes/width, c.bf16),
				})
			}
			writeSafetensors(t, filepath.Join(mnt, "runs/x/model.safetensors"), tensors)
			st := statsJSON(t, mnt)
			t.Logf("%s at commit: stored %d, %d chunks (%d bytes) waiting for a re-encode", c.dtype,
				st["stored_bytes"], st["reencode_pending"], st["reencode_pending_bytes"])
			for deadline := time.Now().Add(2 * time.Minute); st["reencode_pending"] > 0; st = statsJSON(t, mnt) {
				if time.Now().After(deadline) {
					t.Fatalf("%d chunks still wait for a re-encode after 2 minutes idle", st["reencode_pending"])
				}
				time.Sleep(200 * time.Millisecond)
			}
			ratio := float64(st["stored_bytes"]) / float64(st["unique_bytes"])
			t.Logf("%s: unique %d stored %d ratio %.4f (limit %.2f)", c.dtype, st["unique_bytes"], st["stored_bytes"], ratio, c.limit)
			if ratio > c.limit {
				t.Fatalf("stored/unique %.4f > %.2f", ratio, c.limit)
			}
			if code, out, errOut := ckptfs(t, "fsck", "--read-data", mnt); code != 0 {
				t.Fatalf("fsck: %s %s", out, errOut)
			}
			d.stop(syscall.SIGTERM)
		})
	}
}

// TestImportEncodesWhatItStoredRaw: `ckptfs import` into an unmounted store
// mounts it only for the copy, so the chunks its busy commits stored raw
// would stay raw (no idle daemon re-encodes them later). The import drains
// the queue before it closes the store: nothing is left pending and 64 MiB of
// bf16 weights end up as compressed as through a long-lived mount. With
// --inline-encoders -1 every chunk goes raw during the copy, whatever the
// machine's cores, so the drain has all of them to do.
func TestImportEncodesWhatItStoredRaw(t *testing.T) {
	src, store := t.TempDir(), filepath.Join(t.TempDir(), "store")
	const tensorBytes = 8 << 20
	var tensors []stTensor
	for i := 0; i < 64<<20/tensorBytes; i++ {
		tensors = append(tensors, stTensor{
			name: fmt.Sprintf("layers.%02d.weight", i), dtype: "BF16",
			shape: []int64{tensorBytes / 2}, data: normalWeights(int64(100+i), tensorBytes/2, true),
		})
	}
	writeSafetensors(t, filepath.Join(src, "model.safetensors"), tensors)
	sum := importJSON(t, store, src, "runs/imported", "--inline-encoders", "-1")
	if sum.Files != 1 || sum.AddedBytes < 64<<20 || sum.ReencodedChunks < 64 {
		t.Fatalf("import summary %+v, want 1 file adding at least 64 MiB, at least 64 chunks re-encoded", sum)
	}
	st := statsJSON(t, store)
	ratio := float64(st["stored_bytes"]) / float64(st["unique_bytes"])
	t.Logf("after import: unique %d stored %d ratio %.4f, %d chunks pending", st["unique_bytes"], st["stored_bytes"], ratio, st["reencode_pending"])
	if st["reencode_pending"] != 0 {
		t.Errorf("%d chunks (%d bytes) still wait for a re-encode after the import", st["reencode_pending"], st["reencode_pending_bytes"])
	}
	if ratio > 0.68 {
		t.Errorf("stored/unique %.4f > 0.68: the import left chunks raw", ratio)
	}
	if code, out, errOut := ckptfs(t, "fsck", "--read-data", store); code != 0 {
		t.Fatalf("fsck: %s %s", out, errOut)
	}
}
