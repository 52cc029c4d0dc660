package lockorder

import "testing"

// TestInversionCaught: taking nsMu's class, then file.mu's, is reported;
// the documented order is not; nor is a fork's file.mu after its origin's,
// while the reverse (or the same lock's class twice, unnested) is.
func TestInversionCaught(t *testing.T) {
	if !Enabled {
		t.Skip("built without the ckptfs_lockorder tag")
	}
	var ns Mutex[Namespace]
	var file, fork RWMutex[FileContent]
	var attr Mutex[FileAttr]
	ok := Catch(func() {
		file.Lock()
		fork.LockNested()
		ns.Lock()
		attr.Lock()
		attr.Unlock()
		ns.Unlock()
		fork.Unlock()
		file.Unlock()
	})
	if len(ok) != 0 {
		t.Fatalf("the documented order was reported: %v", ok)
	}
	for _, c := range []struct {
		name string
		fn   func()
	}{
		{"file.mu under nsMu", func() { ns.Lock(); file.Lock(); file.Unlock(); ns.Unlock() }},
		{"file.mu read-locked under nsMu", func() { ns.Lock(); file.RLock(); file.RUnlock(); ns.Unlock() }},
		{"two file.mu, unnested", func() { file.Lock(); fork.Lock(); fork.Unlock(); file.Unlock() }},
		{"origin's file.mu under its fork's", func() { fork.LockNested(); file.Lock(); file.Unlock(); fork.Unlock() }},
	} {
		if got := Catch(c.fn); len(got) != 1 {
			t.Errorf("%s: %d inversions reported, want 1", c.name, len(got))
		}
	}
	if v := Violations(); len(v) != 0 {
		t.Fatalf("caught inversions leaked into Violations: %d", len(v))
	}
}
