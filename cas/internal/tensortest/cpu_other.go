//go:build !linux

package tensortest

import "time"

// ThreadCPU is not measured on this platform: the cpu-MB/s metrics read 0.
func ThreadCPU() time.Duration { return 0 }
