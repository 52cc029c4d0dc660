package cas

import (
	"context"
	"errors"
	"testing"

	"github.com/ckptfs/ckptfs/cas/catalog"
)

// errSimulatedCrash stops a re-encode where SimulateReencodeCrash wants it.
var errSimulatedCrash = errors.New("simulated crash after rename")

// SimulateReencodeCrash runs ReencodeOne on s until one chunk's encoded object
// has been renamed over its raw one (and the directory fsync'd), and stops it
// there, before the catalog transaction: the state a crash at that moment
// leaves on disk. It returns that chunk's ID, and fails tb when the queue holds
// no chunk that encodes smaller. For tests; do not run it beside ReencodeOne.
func SimulateReencodeCrash(tb testing.TB, s *Store) ID {
	tb.Helper()
	var hit ID
	stop := func(id ID) error { hit = id; return errSimulatedCrash }
	for {
		more, err := s.re.reencodeGroup(context.Background(), 1, stop)
		if errors.Is(err, errSimulatedCrash) {
			return hit
		}
		if err != nil {
			tb.Fatalf("re-encode: %v", err)
		}
		if !more {
			tb.Fatal("the re-encode queue holds no chunk that encodes smaller")
		}
	}
}

// CatalogPagesInUse returns the page size and the sorted ids of the pages in
// use (meta pages included) of the intact store catalog at path, for tests
// that damage them. It fails tb when the catalog does not check.
func CatalogPagesInUse(tb testing.TB, path string) (pageSize int, ids []uint64) {
	tb.Helper()
	pageSize, ids, err := catalog.PagesInUse(path)
	if err != nil {
		tb.Fatal(err)
	}
	return pageSize, ids
}
