//go:build amd64 && !purego

package cas

// SSE2 kernels for 16-bit elements (bytegroup_amd64.s). SSE2 is part of every
// amd64 CPU, so there is nothing to detect. They handle the multiple of 16
// elements; the Go versions do the rest and the unrotated layout.

//go:noescape
func split2SSE2(raw, p0, p1 []byte)

//go:noescape
func merge2SSE2(out, p0, p1 []byte)

func split2(raw []byte, p0, p1 []byte, rot bool) {
	n := len(p0)
	p1, raw = p1[:n], raw[:2*n]
	if m := n &^ 15; rot && m > 0 {
		split2SSE2(raw[:2*m], p0[:m], p1[:m])
		raw, p0, p1 = raw[2*m:], p0[m:], p1[m:]
	}
	split2Go(raw, p0, p1, rot)
}

func merge2(out []byte, p0, p1 []byte, rot bool) {
	n := len(p0)
	p1, out = p1[:n], out[:2*n]
	if m := n &^ 15; rot && m > 0 {
		merge2SSE2(out[:2*m], p0[:m], p1[:m])
		out, p0, p1 = out[2*m:], p0[m:], p1[m:]
	}
	merge2Go(out, p0, p1, rot)
}
