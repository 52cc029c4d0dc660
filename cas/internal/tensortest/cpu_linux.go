package tensortest

import (
	"syscall"
	"time"
)

// ThreadCPU returns the CPU time the calling OS thread has used (the caller
// must have locked itself to its thread). On a shared machine it measures one
// core's work without the time other processes took it away.
func ThreadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1, &ru); err != nil { // RUSAGE_THREAD
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
