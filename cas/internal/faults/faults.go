//go:build ckptfs_faults

// Package faults lets a test binary leave syncs out, so that the power-loss
// suite (test/powerloss_test.go) can show that it catches a missing sync.
// Only a binary built with the ckptfs_faults tag reads CKPTFS_SKIP_SYNC (a
// comma-separated list of the names below); release builds compile
// faults_off.go, where Skip is a constant false.
//
//	object    the fdatasync of each object before a commit names it (cas/backend/local)
//	objdir    the fsync of the object directories (cas/backend/local)
//	catalog   the catalog's fdatasyncs of each commit: its log's (catalog/wal.go),
//	          bbolt's where it keeps none (DB.NoSync)
//	storedir  the fsync of the store directory after creating its catalog and objects/
package faults

import (
	"os"
	"strings"
)

// Skip reports whether the sync named what is to be left out.
func Skip(what string) bool {
	for _, s := range strings.Split(os.Getenv("CKPTFS_SKIP_SYNC"), ",") {
		if s == what {
			return true
		}
	}
	return false
}
