//go:build !amd64 || purego

package object

func split2(raw []byte, p0, p1 []byte, rot bool)         { split2Go(raw, p0, p1, rot) }
func merge2(out []byte, p0, p1 []byte, rot bool)         { merge2Go(out, p0, p1, rot) }
func merge4(out []byte, p0, p1, p2, p3 []byte, rot bool) { merge4Go(out, p0, p1, p2, p3, rot) }
