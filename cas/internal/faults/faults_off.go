//go:build !ckptfs_faults

// Package faults lets a test binary built with the ckptfs_faults tag leave
// syncs out (faults.go); in release builds Skip is a constant false.
package faults

// Skip is false: no sync is ever left out.
func Skip(string) bool { return false }
