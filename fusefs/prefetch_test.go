package fusefs

import "testing"

// TestReadRuns checks the sequential-read detector against READ orders
// traced from real readers (doc.go, Reads): the kernel's two READs in
// flight arrive in either order and must keep one run; torch.load's zip
// header probes and seeks must not.
func TestReadRuns(t *testing.T) {
	const K, M = 1 << 10, 1 << 20
	type read struct{ off, size int64 }
	// pairs of 256 KiB READs, each pair answered second first (dd bs=16M,
	// torch.load, read(2) of a 4 MiB buffer at the default readahead).
	var swapped []read
	for off := int64(0); off < 16*M; off += 512 * K {
		swapped = append(swapped, read{off + 256*K, 256 * K}, read{off, 256 * K})
	}
	// torch.load(mmap=True) reading the header of each record, 8 KiB per
	// tensor of 64 KiB.
	var probes []read
	for off := int64(4 * K); off < 16*M; off += 72 * K {
		probes = append(probes, read{off, 8 * K})
	}
	tests := []struct {
		name     string
		reads    []read
		wantRead int64 // bytes the last run read
	}{
		{"in order", []read{{0, 256 * K}, {256 * K, 256 * K}, {512 * K, 256 * K}}, 768 * K},
		{"two in flight, either order", swapped, 16 * M},
		{"a read behind the frontier", []read{{0, M}, {M, M}, {512 * K, 256 * K}, {2 * M, M}}, 3 * M},
		{"header probes", probes, 8 * K},
		{"a seek ahead", []read{{0, M}, {M, M}, {64 * M, 256 * K}}, 256 * K},
		{"a seek back", []read{{32 * M, M}, {33 * M, M}, {0, 256 * K}}, 256 * K},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rs readState
			for _, r := range tt.reads {
				rs.note(r.off, r.off+r.size)
			}
			if rs.read != tt.wantRead {
				t.Errorf("run read %d bytes [%d, %d), want %d", rs.read, rs.start, rs.frontier, tt.wantRead)
			}
		})
	}
}
