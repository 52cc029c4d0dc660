//go:build !ckptfs_lockorder

package lockorder

// Enabled reports whether lock order is checked (the ckptfs_lockorder tag).
const Enabled = false

func acquire(any, int, int, string) {}
func release(any)                   {}

// Violations returns the inversions recorded so far: none without the tag.
func Violations() []string { return nil }

// Catch runs fn and returns the inversions it made, which are then not
// counted in Violations: none without the tag.
func Catch(fn func()) []string { fn(); return nil }
