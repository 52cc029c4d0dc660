package cas

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A crash while a store was being created leaves at most the catalog being
// built and the writability probe; the next Open creates the store anyway.
// Anything else in the directory is still refused.
func TestOpenAfterInterruptedCreation(t *testing.T) {
	for _, tc := range []struct {
		name    string
		files   []string
		refused bool
	}{
		{"torn catalog and probe", []string{catalogTemp, ".probe-123"}, false},
		{"probe only", []string{".probe-9"}, false},
		{"someone's file", []string{catalogTemp, "notes.txt"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, f), []byte("half a page"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			s, err := openLocal(dir, Options{})
			if tc.refused {
				if !errors.Is(err, ErrNotStore) {
					t.Fatalf("Open: %v, want ErrNotStore", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if _, err := s.AllocIno(); err != nil {
				t.Fatal(err)
			}
			ents, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			// An open store's catalog has its write-ahead log beside it.
			want := []string{catalogName, "catalog.wal", "catalog.wal.data", objectsName, spoolName}
			if !slices.Equal(names, want) {
				t.Fatalf("store holds %v, want %v", names, want)
			}
		})
	}
}
