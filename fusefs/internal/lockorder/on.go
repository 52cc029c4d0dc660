//go:build ckptfs_lockorder

package lockorder

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
)

// Enabled reports whether lock order is checked (the ckptfs_lockorder tag).
const Enabled = true

type held struct {
	lock      any
	rank, sub int
	name      string
}

var (
	mu         sync.Mutex
	holding    = map[int64][]held{} // by goroutine, in the order taken
	catching   = map[int64][]string{}
	violations []string
)

// goid returns the calling goroutine's id, from its stack's first line
// ("goroutine 42 [running]:"). Slow, but only ever built into tests.
func goid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		panic("lockorder: cannot read the goroutine id: " + err.Error())
	}
	return id
}

func acquire(lock any, rank, sub int, name string) {
	g := goid()
	mu.Lock()
	defer mu.Unlock()
	for _, h := range holding[g] {
		if h.rank < rank || h.rank == rank && h.sub < sub && h.lock != lock {
			continue
		}
		stack := make([]byte, 16<<10)
		stack = stack[:runtime.Stack(stack, false)]
		v := fmt.Sprintf("lock order inverted: %s taken while holding %s (the order is file.releaseMu → file.commitMu → file.mu → FS.nsMu → FS.viewMu → file.attrMu; a fork's file.mu after its origin's)\n%s",
			describe(name, sub), describe(h.name, h.sub), stack)
		if c, ok := catching[g]; ok {
			catching[g] = append(c, v)
		} else {
			violations = append(violations, v)
			fmt.Fprintln(os.Stderr, v)
		}
		break
	}
	holding[g] = append(holding[g], held{lock, rank, sub, name})
}

func describe(name string, sub int) string {
	if sub > 0 {
		return name + " (nested)"
	}
	return name
}

func release(lock any) {
	g := goid()
	mu.Lock()
	defer mu.Unlock()
	if drop(g, lock) {
		return
	}
	// Unlocked by another goroutine than the one that locked it.
	for other := range holding {
		if drop(other, lock) {
			return
		}
	}
}

// drop forgets the latest hold of lock by goroutine g (mu held).
func drop(g int64, lock any) bool {
	hs := holding[g]
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].lock == lock {
			hs = append(hs[:i], hs[i+1:]...)
			if len(hs) == 0 {
				delete(holding, g)
			} else {
				holding[g] = hs
			}
			return true
		}
	}
	return false
}

// Violations returns the inversions recorded so far.
func Violations() []string {
	mu.Lock()
	defer mu.Unlock()
	return append([]string(nil), violations...)
}

// Catch runs fn and returns the inversions it made on the calling
// goroutine, which are then not counted in Violations. fn must release
// the locks it takes.
func Catch(fn func()) []string {
	g := goid()
	mu.Lock()
	catching[g] = []string{}
	mu.Unlock()
	defer func() {
		mu.Lock()
		delete(catching, g)
		mu.Unlock()
	}()
	fn()
	mu.Lock()
	defer mu.Unlock()
	return catching[g]
}
