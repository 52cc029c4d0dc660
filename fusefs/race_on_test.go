//go:build race

package fusefs

// raceEnabled: the race detector makes each mount and read several times
// slower, so long sweeps sample fewer cases (Makefile runs them without it).
const raceEnabled = true
