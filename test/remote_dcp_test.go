package test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// dcpSave is the training side of TestRemoteDCPMultiNode: world_size
// processes (gloo), each standing for one node, save one
// torch.distributed.checkpoint into the same step directory, each through
// its own node's mount (argv: step directory inside a mount, then one
// mount point per rank). The model's weights are DTensors sharded over the
// ranks (each rank writes its rows), plus per-rank state (an optimizer's
// step count, an RNG state) that only its rank holds. The coordinator,
// rank 0, also writes .metadata (through a temporary name and a rename).
const dcpSave = `
import os, sys, torch, torch.distributed as dist, torch.multiprocessing as mp
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import distribute_tensor, Shard

step, mounts, port = sys.argv[1], sys.argv[2:-1], sys.argv[-1]

def full_state():
    g = torch.Generator().manual_seed(1234)
    return {f"layer{i}.weight": torch.randn(64 + 8 * i, 96, generator=g) for i in range(6)} | \
           {"embed": torch.randn(256, 48, generator=g).to(torch.bfloat16)}

def run(rank, world):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", port
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    sd = {k: distribute_tensor(v, mesh, [Shard(0)]) for k, v in full_state().items()}
    sd[f"rank{rank}.step"] = torch.tensor([1000 + rank])
    sd[f"rank{rank}.rng"] = torch.arange(16, dtype=torch.int64) * (rank + 1)
    path = os.path.join(mounts[rank], step)
    os.makedirs(path, exist_ok=True)
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(path))
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(run, args=(len(mounts),), nprocs=len(mounts), join=True)
    print("saved")
`

// dcpLoad is the loading side: one process, no process group, loads the
// whole checkpoint from a reading mount into full (unsharded) tensors and
// compares every one with what was saved.
const dcpLoad = `
import sys, torch
import torch.distributed.checkpoint as dcp
path, world = sys.argv[1], int(sys.argv[2])
g = torch.Generator().manual_seed(1234)
want = {f"layer{i}.weight": torch.randn(64 + 8 * i, 96, generator=g) for i in range(6)} | \
       {"embed": torch.randn(256, 48, generator=g).to(torch.bfloat16)}
for r in range(world):
    want[f"rank{r}.step"] = torch.tensor([1000 + r])
    want[f"rank{r}.rng"] = torch.arange(16, dtype=torch.int64) * (r + 1)
got = {k: torch.zeros_like(v) for k, v in want.items()}
dcp.load(got, checkpoint_id=path)
bad = [k for k in want if not torch.equal(got[k], want[k])]
if bad:
    sys.exit("tensors differ from what was saved: " + ", ".join(bad))
print(f"loaded {len(want)} tensors, all equal")
`

// TestRemoteDCPMultiNode: a multi-node torch.distributed.checkpoint through
// the remote tier. Four writer mounts (four stores, standing for four
// nodes) on one prefix, one rank each, save one checkpoint into the same
// step directory; each node syncs. A fifth, reading mount then sees the
// step directory whole (every rank's shard file and the coordinator's
// .metadata) and loads it into full tensors equal to the saved state; so
// does a fresh reading mount started afterwards.
func TestRemoteDCPMultiNode(t *testing.T) {
	py := python(t)
	e := newFaultEnv(t, "dcp")
	t.Setenv(refreshEnv, "500ms")
	const world = 4
	var mnts []string
	for i := range world {
		_, m := e.writer(fmt.Sprintf("node%d", i))
		mnts = append(mnts, m)
	}
	_, mR := e.reader("reader")

	step := filepath.Join("runs", "dcp", "step-100")
	script := filepath.Join(t.TempDir(), "save.py")
	if err := os.WriteFile(script, []byte(dcpSave), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append(append([]string{script, step}, mnts...), fmt.Sprint(freePort(t)))
	cmd := exec.Command(py, args...)
	cmd.Dir = "/"
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("dcp.save on %d mounts: %v\n%s", world, err, out.String())
	}
	t.Logf("dcp.save of %d ranks, one mount each: %v", world, time.Since(start).Round(time.Millisecond))
	for _, m := range mnts {
		e.sync(m)
	}

	// What each node wrote, byte for byte, is what the reader must show.
	want := map[string][]byte{}
	for i, m := range mnts {
		names, err := os.ReadDir(filepath.Join(m, step))
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			b, err := os.ReadFile(filepath.Join(m, step, n.Name()))
			if err != nil {
				t.Fatal(err)
			}
			// A node's own files are those its rank wrote; the others'
			// arrive there by refresh too, and must agree.
			if prev, ok := want[n.Name()]; ok && !bytes.Equal(prev, b) {
				t.Fatalf("%s differs between node 0..%d", n.Name(), i)
			}
			want[n.Name()] = b
		}
	}
	if _, ok := want[".metadata"]; !ok {
		t.Fatalf("no .metadata in %s on any node: %v", step, keys(want))
	}
	shards := 0
	for n := range want {
		if strings.HasSuffix(n, ".distcp") {
			shards++
		}
	}
	if shards < world {
		t.Fatalf("%d shard files across the nodes, want at least %d: %v", shards, world, keys(want))
	}
	for n, b := range want {
		waitContent(t, filepath.Join(mR, step, n), b)
	}
	for _, n := range []string{".metadata.tmp"} {
		if _, err := os.Lstat(filepath.Join(mR, step, n)); err == nil {
			t.Errorf("the reader shows %s, which rank 0 renamed", n)
		}
	}
	t.Logf("the reader shows %d files (%d shards) of the checkpoint", len(want), shards)

	load := func(mnt string) {
		t.Helper()
		got := runPy(t, dcpLoad, filepath.Join(mnt, step), fmt.Sprint(world))
		t.Logf("%s: %s", mnt, got)
	}
	load(mR)
	// A reader started now sees the same checkpoint from the bucket alone.
	_, mF := e.reader("fresh")
	load(mF)
}

func keys(m map[string][]byte) []string {
	var s []string
	for k := range m {
		s = append(s, k)
	}
	return s
}
