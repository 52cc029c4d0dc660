package main

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// cpuProfileEnv names a file for a CPU profile of the whole daemon, from
// serveMount's start to its return (an unmount): `go tool pprof bin/ckptfs
// FILE`. An environment variable, not a flag, so that a daemon started by
// mount(8), --background or a test harness can be profiled without changing
// its command line; unset, it costs nothing.
const cpuProfileEnv = "CKPTFS_CPUPROFILE"

// startCPUProfile starts the profile cpuProfileEnv asks for, if any, and
// returns the function that writes it out.
func startCPUProfile() (stop func(), err error) {
	path := os.Getenv(cpuProfileEnv)
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cpuProfileEnv, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", cpuProfileEnv, err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
