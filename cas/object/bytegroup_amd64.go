//go:build amd64 && !purego

package object

// SSE2 kernels of byte grouping (bytegroup_amd64.s). SSE2 is part of every
// amd64 CPU, so there is nothing to detect. They handle the multiple of 16
// elements; the Go versions do the rest (and split2's unrotated layout).

//go:noescape
func split2SSE2(raw, p0, p1 []byte)

//go:noescape
func merge2SSE2(out, p0, p1 []byte)

//go:noescape
func merge2PlainSSE2(out, p0, p1 []byte)

//go:noescape
func merge4SSE2(out, p0, p1, p2, p3 []byte, rot bool)

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
	if m := n &^ 15; m > 0 {
		if rot {
			merge2SSE2(out[:2*m], p0[:m], p1[:m])
		} else {
			merge2PlainSSE2(out[:2*m], p0[:m], p1[:m])
		}
		out, p0, p1 = out[2*m:], p0[m:], p1[m:]
	}
	merge2Go(out, p0, p1, rot)
}

// merge4 is merge4Go: the planes of 32-bit elements (a delta's; a
// standalone fp32 chunk is mostly wide, merge4wide) interleaved 16
// elements at a time.
func merge4(out []byte, p0, p1, p2, p3 []byte, rot bool) {
	n := len(p0)
	p1, p2, p3, out = p1[:n], p2[:n], p3[:n], out[:4*n]
	if m := n &^ 15; m > 0 {
		merge4SSE2(out[:4*m], p0[:m], p1[:m], p2[:m], p3[:m], rot)
		out, p0, p1, p2, p3 = out[4*m:], p0[m:], p1[m:], p2[m:], p3[m:]
	}
	merge4Go(out, p0, p1, p2, p3, rot)
}
