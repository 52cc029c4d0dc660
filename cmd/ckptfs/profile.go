package main

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
)

// Profiles of the whole daemon, from serveMount's start to its return (an
// unmount), each written to the file its environment variable names: `go
// tool pprof bin/ckptfs FILE`. Environment variables, not flags, so that a
// daemon started by mount(8), --background or a test harness can be
// profiled without changing its command line; unset, they cost nothing.
const (
	cpuProfileEnv = "CKPTFS_CPUPROFILE"
	// memProfileEnv: the allocations profile (pprof's "allocs": every
	// allocation since the start, sampled one per 512 KiB by the runtime's
	// default rate, by bytes and by count; -sample_index=alloc_space or
	// alloc_objects), written at the unmount. What a workload allocates is
	// what the collector's share of its CPU follows.
	memProfileEnv = "CKPTFS_MEMPROFILE"
)

// startProfiles starts the profiles cpuProfileEnv and memProfileEnv ask
// for, if any, and returns the function that writes them out.
func startProfiles() (stop func() error, err error) {
	memPath := os.Getenv(memProfileEnv)
	cpuPath := os.Getenv(cpuProfileEnv)
	if cpuPath == "" {
		return func() error { return writeAllocsProfile(memPath) }, nil
	}
	f, err := os.Create(cpuPath)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cpuProfileEnv, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", cpuProfileEnv, err)
	}
	return func() error {
		pprof.StopCPUProfile()
		err := f.Close()
		if err != nil {
			err = fmt.Errorf("%s: %w", cpuProfileEnv, err)
		}
		return errors.Join(err, writeAllocsProfile(memPath))
	}, nil
}

// writeAllocsProfile writes the allocations profile to path, if one is named.
func writeAllocsProfile(path string) error {
	if path == "" {
		return nil
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("%s: %w", memProfileEnv, err)
	}
	// The profile is as of the last completed collection: without one
	// here it left out what was allocated since (a cold read of 1 GiB
	// showed 360 MiB of the 600 the runtime counted), as runtime/pprof's
	// own example warns.
	runtime.GC()
	err = pprof.Lookup("allocs").WriteTo(f, 0)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", memProfileEnv, err)
	}
	return nil
}
