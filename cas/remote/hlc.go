package remote

// Stamp is a hybrid logical clock reading: wall-clock nanoseconds and a
// counter that orders stamps with the same wall time. Stamps order the
// versions of one path across writer sessions: the later wins, equal
// stamps are ordered by session ID (doc.go, "Which version wins").
type Stamp struct {
	Wall    int64  `json:"w"`
	Logical uint32 `json:"l,omitempty"`
}

// Less orders stamps.
func (a Stamp) Less(b Stamp) bool {
	return a.Wall < b.Wall || (a.Wall == b.Wall && a.Logical < b.Logical)
}

// after returns the stamp of a change made at wall-clock time at (ns) to a
// path whose version seen here was stamped prev: at itself when it is
// later, else the next stamp after prev, so that a change always wins over
// the version it changed, whatever the clocks of the hosts involved.
func after(at int64, prev Stamp) Stamp {
	if at > prev.Wall {
		return Stamp{Wall: at}
	}
	return Stamp{Wall: prev.Wall, Logical: prev.Logical + 1}
}
