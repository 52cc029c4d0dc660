package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
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
	// traceEnv: the runtime's execution trace (runtime/trace): what each
	// goroutine waited on, and for how long. `go tool trace -pprof=sync
	// FILE` (or sched, syscall) turns it into a profile of where the
	// daemon's goroutines blocked instead of ran.
	traceEnv = "CKPTFS_TRACE"
)

// startProfiles starts the profiles cpuProfileEnv, memProfileEnv and
// traceEnv ask for, if any, and returns the function that writes them out.
func startProfiles() (stop func() error, err error) {
	memPath := os.Getenv(memProfileEnv)
	cpuStop, err := startStream(cpuProfileEnv, pprof.StartCPUProfile, pprof.StopCPUProfile)
	if err != nil {
		return nil, err
	}
	traceStop, err := startStream(traceEnv, trace.Start, trace.Stop)
	if err != nil {
		return nil, errors.Join(err, cpuStop())
	}
	return func() error {
		return errors.Join(cpuStop(), traceStop(), writeAllocsProfile(memPath))
	}, nil
}

// startStream starts a profile that streams into the file the environment
// variable env names (none: it costs nothing), and returns what stops it
// and closes the file.
func startStream(env string, start func(io.Writer) error, stop func()) (func() error, error) {
	path := os.Getenv(env)
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", env, err)
	}
	if err := start(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", env, err)
	}
	return func() error {
		stop()
		if err := f.Close(); err != nil {
			return fmt.Errorf("%s: %w", env, err)
		}
		return nil
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
