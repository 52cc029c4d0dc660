package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/ckptfs/ckptfs/cas/remote"
	"github.com/ckptfs/ckptfs/gc"
)

// TestGCReport: gc's summary line and stdout keep this machine's figures
// and the bucket's apart (labelled local: and remote:, never added up) when
// the remote was collected, are unlabelled as before when not, and print
// no raw size gc does not know: none when no freed chunk had a catalog row
// (fetched copies, objects no commit named), and on a writer of a remote
// one that says it counts only the chunks committed here.
func TestGCReport(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name    string
		res     gc.Result
		summary string
		stdout  []string // its lines, in order
	}{
		{"local store", gc.Result{Objects: 10, Marked: 6, Unreferenced: 4, Chunks: 4, FreedBytes: 3 * mib, FreedRawBytes: 4 * mib},
			"gc: freed 3.00 MiB (4 chunks) of 10 objects",
			[]string{"freed 4 chunks, 3.00 MiB (4.00 MiB raw)", "objects 10, referenced 6, unreferenced 4 (0 kept: younger than 0s; 0 in use by commits)"}},
		{"local store, a crash's objects only", gc.Result{Objects: 10, Marked: 8, Unreferenced: 2, Chunks: 2, FreedBytes: 2 * mib},
			"gc: freed 2.00 MiB (2 chunks) of 10 objects",
			[]string{"freed 2 chunks, 2.00 MiB (raw size not recorded: objects no commit named)", "objects 10, referenced 8, unreferenced 2 (0 kept: younger than 0s; 0 in use by commits)"}},
		{"nothing freed", gc.Result{Objects: 10, Marked: 10, Packs: 2},
			"gc: freed 0 B (0 chunks) of 10 objects and 2 packs",
			[]string{"freed 0 chunks, 0 B", "objects 10, referenced 10, unreferenced 0 (0 kept: younger than 0s; 0 in use by commits)"}},
		{"remote writer, fetched copies", gc.Result{Objects: 119, Marked: 31, Unreferenced: 88, Chunks: 88, FreedBytes: 3 * mib,
			CollectResult: remote.CollectResult{Objects: 119, Freed: 88, FreedBytes: 3 * mib}},
			"gc: local: freed 3.00 MiB (88 chunks) of 119 objects; remote: freed 3.00 MiB (88 of 119 chunk objects in the bucket)",
			[]string{
				"local: freed 88 chunks, 3.00 MiB (raw size not recorded: copies fetched from the bucket, or objects no commit named)",
				"local: objects 119, referenced 31, unreferenced 88 (0 kept: younger than 0s; 0 in use by commits)",
				"remote: freed 88 of 119 chunk objects in the bucket, 3.00 MiB (0 unreferenced kept: younger than 0s)"}},
		{"remote writer, own chunks, beside a live writer", gc.Result{Objects: 20, Marked: 15, Unreferenced: 5, Chunks: 5, FreedBytes: mib, FreedRawBytes: 2 * mib,
			BasesKept: 1, LiveDeltas: 3, TempFiles: 1,
			CollectResult: remote.CollectResult{Objects: 50, Young: 1, Trashed: 4, TrashedBytes: mib, TrashList: "L"}},
			"gc: local: freed 1.00 MiB (5 chunks) of 20 objects; remote: freed 0 B (0 of 50 chunk objects in the bucket, 4 put in a trash list)",
			[]string{
				"local: freed 5 chunks, 1.00 MiB (2.00 MiB raw in the chunks committed here; copies fetched from the bucket not counted)",
				"local: objects 20, referenced 15, unreferenced 5 (0 kept: younger than 0s; 0 in use by commits)",
				"local: kept 1 chunks no file names (sizes not recorded: copies fetched from the bucket): bases of 3 live deltas (freed with the last of them)",
				"local: index rows without objects removed 0, temporary files removed 1",
				"remote: freed 0 of 50 chunk objects in the bucket, 0 B (1 unreferenced kept: younger than 0s)",
				"remote: put 4 chunk objects, 1.00 MiB, in trash list L (other writers are live): a gc after the grace period, once each live writer acknowledged it, deletes those still unused"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := gcSummary(tc.res, "freed"); got != tc.summary {
				t.Errorf("summary %q\nwant    %q", got, tc.summary)
			}
			var out bytes.Buffer
			writeGCResult(&out, tc.res, "freed", time.Duration(0))
			if got, want := out.String(), strings.Join(tc.stdout, "\n")+"\n"; got != want {
				t.Errorf("stdout\n%s\nwant\n%s", got, want)
			}
		})
	}
}
