//go:build !linux

package cas

import "time"

// threadCPU is not measured on this platform: the cpu-MB/s metrics read 0.
func threadCPU() time.Duration { return 0 }
