package formats

import "encoding/binary"

// defaultMaxChunk is the chunk size limit NewChunker uses for maxChunk ≤ 0.
const defaultMaxChunk = 1 << 20

// minMaxChunk is the smallest chunk size limit NewChunker accepts.
const minMaxChunk = 64

// maxDescScan bounds how far a Chunker looks for the data descriptor of a
// zip entry whose size is not in its local header (torch's small records).
const maxDescScan = 1 << 20

// minDataChunk is the smallest data segment cut into chunks of its own;
// smaller ones are cut by content with the bytes around them. A chunk is a
// store object: a safetensors file of 10^6 scalars must not cost 10^6 of
// them.
const minDataChunk = 4 << 10

// MinDataChunk is the size from which a tensor that is a whole data segment
// gets chunks of its own, cut by one rule in every format (see the package
// doc). A smaller tensor shares its chunk with bytes around it that depend
// on the container, so a tensor hash meant to match across formats must
// hash such a tensor's bytes, not its chunks.
const MinDataChunk = minDataChunk

// headerStep bounds how many bytes a Chunker asks for beyond those it knows
// to be metadata while it reads a header whose end it does not know yet (a
// torch data.pkl, a GGUF header): it parses again every headerStep bytes, so
// a 100 MB GGUF header costs a handful of parses, not one per Write.
const headerStep = 8 << 20

// MaxLag bounds how far the cuts of a Chunker with chunk size limit maxChunk
// lag behind the bytes written: after every Write, all bytes but the last
// MaxLag(maxChunk) are in chunks already cut. A writer that holds uncut
// bytes in memory (fusefs's stream) needs room for that much plus what it
// feeds per Write, or it waits forever for a cut.
//
// Header bytes count as cut once they are known to be metadata: a Chunker
// cuts them by content as they arrive (cutPending) while it keeps a copy
// for its parser, so a header of any legal size streams through.
func MaxLag(maxChunk int) int64 {
	mc := int64(maxChunk)
	if mc <= 0 {
		mc = defaultMaxChunk
	}
	return max(mc, minMaxChunk) + max(headerStep, maxDescScan+64, maxNPYHeader, 2<<16+30)
}

// Chunker cuts a file, fed in order, into chunks; see NewChunker.
//
// The Chunker is a pipeline of two parts. A format state machine (the
// step functions below) looks at buffered bytes and claims the next bytes
// of the file as metadata (CDC-cut), as one data segment (cut by offset
// arithmetic), or as the rest of the file (CDC-cut). The cutter then
// consumes claimed bytes straight from the caller's buffer. Only bytes the
// state machine must look at before it can claim them (headers, a torch
// data.pkl, zip local headers) are copied into the pending buffer.
type Chunker struct {
	maxChunk int64
	p        cdcParams

	off     int64    // bytes written
	done    int64    // bytes given to the cutter; the pending bytes are [done, off)
	cdcPos  int64    // bytes content-defined cutting has seen: done, or more while a header is pending
	metaEnd int64    // pending bytes below this are known to be metadata (see cutPending)
	lastCut int64    // end of the last chunk
	h       uint64   // gear hash of the open CDC chunk
	out     []int64  // cuts made during the current call
	outType []string // dtype of each chunk in out ("" outside data segments)

	buf  []byte // pending bytes are buf[bufR:]
	bufR int

	claim    int64  // claimed bytes not yet consumed; -1: up to EOF
	isData   bool   // the current claim is a data segment
	dtype    string // the current data segment's element type
	dataNext int64  // next cut inside the data segment
	dataEnd  int64
	dataTail int64 // cut before the segment's tail edge chunk; 0: none

	need int      // bytes step needs pending before it runs
	step stepFunc // the format state machine's next step

	// What the stream taught so far.
	format    string
	failed    bool // the stream stopped parsing; it is CDC-cut to EOF
	complete  bool // the stream ended where its format says it must
	segs      segmentBuilder
	restStart int64
	restKind  SegmentKind
	tensors   []Tensor
	queue     []claimItem
	after     stepFunc

	zip   zipStream
	parts *partState // a part format's scanner (tree models, pickles)
}

// stepFunc examines the pending bytes b (starting at file offset c.done;
// eof means no byte will follow them) and either claims bytes or asks for
// more with c.wait.
type stepFunc func(c *Chunker, b []byte, eof bool)

// claimItem is a queued claim: a data segment (dtype set, kind KindData) or
// a non-data run.
type claimItem struct {
	n     int64
	kind  SegmentKind
	dtype string
}

// NewChunker returns a Chunker that cuts data segments into chunks of at
// most maxChunk bytes (1 MiB if maxChunk ≤ 0; at least 64).
//
// The Chunker sniffs the format from the first bytes and learns segment
// boundaries as bytes arrive (safetensors: the header first; torch zip:
// data.pkl first, then each record's local header before its data;
// gguf/npy: the header first; npz: each member's local and .npy headers
// before its data). Each data segment of at least 4 KiB is cut by one rule
// relative to its first byte, in every format: small edge chunks at both
// ends, pieces of at most maxChunk between (see claimData). So the same
// tensor at another file offset, or in another format, yields the same
// chunks. All other bytes (headers, unknown formats, input that stops
// parsing) are cut by content-defined chunking (FastCDC; min 8 KiB, avg
// 32 KiB, max min(128 KiB, maxChunk)),
// so unchanged parts of unknown formats still deduplicate after
// insertions. Data segments always start and end at a cut; runs of
// non-data segments are CDC-cut as one stream.
//
// Memory: the Chunker keeps at most about 100 MB of pending header bytes
// (the safetensors header limit; far less for typical files) plus the
// learned index; it never buffers tensor data. A Chunker is not safe for
// concurrent use.
func NewChunker(maxChunk int) *Chunker {
	mc := int64(maxChunk)
	if mc <= 0 {
		mc = defaultMaxChunk
	}
	mc = max(mc, minMaxChunk)
	return &Chunker{maxChunk: mc, p: newCDCParams(mc), need: 10, step: stepSniff}
}

// CutsByContent reports whether a Chunker cuts a file that starts with head
// (its first 10 bytes or more) by content alone, from its first byte to its
// end: no format is sniffed from those bytes, so none is parsed, whatever
// follows them. Such a file's cuts depend only on the bytes after each cut,
// so a file that grows by appends keeps every cut of its old content but the
// last, which was its end (NewContentChunker).
func CutsByContent(head []byte) bool {
	if len(head) < 10 || sniff(head) != "" {
		return false
	}
	sc, _ := sniffParts(head)
	return sc == nil
}

// NewContentChunker returns a Chunker for the bytes of a file from one of
// its cuts on, when CutsByContent says the file is cut by content alone: fed
// those bytes, it makes the cuts NewChunker makes from there, as offsets
// from where it started. Its Index is that of an unknown format.
func NewContentChunker(maxChunk int) *Chunker {
	c := NewChunker(maxChunk)
	c.claimRest(KindOther, true)
	return c
}

// Write feeds the next bytes of the file (contiguous, in order) and returns
// the chunk boundaries that became final: each cut is the end offset of a
// chunk, chunks being [previous cut, cut). Write never retains p and never
// fails: odd content is simply CDC-cut. The returned slice is the caller's.
func (c *Chunker) Write(p []byte) []int64 {
	cuts := c.WriteCuts(p)
	out := make([]int64, len(cuts))
	for i, k := range cuts {
		out[i] = k.End
	}
	return out
}

// Cut is a chunk boundary: the chunk ends at End, and DType is the element
// type of the tensor data it holds ("" for metadata, unknown bytes, and data
// of unknown type), a hint for compression.
type Cut struct {
	End   int64
	DType string
}

// WriteCuts is Write, with each cut's element type.
func (c *Chunker) WriteCuts(p []byte) []Cut {
	c.out, c.outType = nil, nil
	c.off += int64(len(p))
	c.run(p, false)
	return c.takeCuts()
}

func (c *Chunker) takeCuts() []Cut {
	cuts := make([]Cut, len(c.out))
	for i := range c.out {
		cuts[i] = Cut{End: c.out[i], DType: c.outType[i]}
	}
	c.out, c.outType = nil, nil
	return cuts
}

// Close ends the stream. It returns the remaining cuts (the last one is
// the total size; an empty file gives none) and the Index learned from the
// stream. The Index has Format "" and a single KindOther segment when the
// format is unknown or the stream did not parse to a valid end (for
// example a truncated file); that is never an error. Close must be called
// once, after the last Write.
func (c *Chunker) Close() ([]int64, *Index) {
	cuts, ix := c.CloseCuts()
	out := make([]int64, len(cuts))
	for i, k := range cuts {
		out[i] = k.End
	}
	return out, ix
}

// CloseCuts is Close, with each cut's element type.
func (c *Chunker) CloseCuts() ([]Cut, *Index) {
	c.out, c.outType = nil, nil
	c.run(nil, true)
	if c.claim > 0 {
		c.failed = true // the file ended inside a claimed range
	}
	c.emit(c.off)
	cuts := c.takeCuts()
	return cuts, c.index()
}

// run moves bytes from the pending buffer and then p through the state
// machine and the cutter.
func (c *Chunker) run(p []byte, eof bool) {
	for {
		if c.claim != 0 {
			if pend := len(c.buf) - c.bufR; pend > 0 {
				k := int64(pend)
				if c.claim > 0 {
					k = min(k, c.claim)
				}
				c.bufR += c.consume(c.buf[c.bufR : c.bufR+int(k)])
				if c.bufR == len(c.buf) {
					c.resetBuf()
				}
				continue
			}
			if len(p) == 0 {
				return
			}
			k := int64(len(p))
			if c.claim > 0 {
				k = min(k, c.claim)
			}
			p = p[c.consume(p[:k]):]
			continue
		}
		pend := len(c.buf) - c.bufR
		if pend < c.need {
			if len(p) > 0 {
				k := min(c.need-pend, len(p))
				if cap(c.buf)-len(c.buf) < k {
					// Grow to what the step needs, at least doubling (steps
					// ask for a header headerStep bytes at a time) but not
					// past the header limit, dropping consumed bytes.
					nb := make([]byte, pend, max(c.need, 4096, min(2*pend, maxHeaderSize)))
					copy(nb, c.buf[c.bufR:])
					c.buf, c.bufR = nb, 0
				}
				c.buf = append(c.buf, p[:k]...)
				p = p[k:]
				continue
			}
			if !eof {
				c.cutPending()
				return
			}
			c.step(c, c.buf[c.bufR:], true)
			if c.claim == 0 && c.need > len(c.buf)-c.bufR {
				c.fail() // a step asked for bytes that will never come
			}
			continue
		}
		c.step(c, c.buf[c.bufR:], eof && len(p) == 0)
	}
}

// cutPending cuts by content the pending bytes known to be metadata (below
// metaEnd) while the step waits for more of them. The same bytes are claimed
// as metadata later, and content-defined cuts depend only on the bytes, so
// the cuts are those a later claim would make: consume skips what was cut
// here. A malformed file whose "metadata" turns out to be data is CDC-cut to
// its end (claimData).
func (c *Chunker) cutPending() {
	end := min(c.metaEnd, c.off)
	if c.claim != 0 || end <= c.cdcPos {
		return
	}
	c.isData = false
	from, to := c.bufR+int(c.cdcPos-c.done), c.bufR+int(end-c.done)
	c.cdc(c.buf[from:to])
}

// resetBuf empties the pending buffer, dropping a large one.
func (c *Chunker) resetBuf() {
	c.bufR = 0
	if cap(c.buf) > 1<<20 {
		c.buf = nil
	} else {
		c.buf = c.buf[:0]
	}
}

// consume hands claimed bytes to the cutter and returns how many it took:
// all of b, unless a part format's scanner starts a data segment inside it.
func (c *Chunker) consume(b []byte) int {
	if c.parts != nil && !c.isData {
		return c.consumeParts(b) // the rest of the file: c.claim is -1
	}
	n := int64(len(b))
	if c.claim > 0 {
		c.claim -= n
	}
	end := c.done + n
	if !c.isData {
		// cutPending may have cut a prefix of these bytes already.
		if skip := c.cdcPos - c.done; skip < n {
			c.cdc(b[max(skip, 0):])
		}
		c.done = end
		return len(b)
	}
	for c.dataNext <= end {
		c.emit(c.dataNext)
		if c.dataNext == c.dataEnd {
			c.dataNext = maxInt64
			break
		}
		next := min(c.dataNext+c.maxChunk, c.dataEnd)
		if c.dataTail > c.dataNext && next > c.dataTail {
			next = c.dataTail
		}
		c.dataNext = next
	}
	c.done, c.cdcPos = end, end
	return len(b)
}

// cdc cuts b, the bytes at c.cdcPos, by content.
func (c *Chunker) cdc(b []byte) {
	p := &c.p
	for len(b) > 0 {
		clen := c.cdcPos - c.lastCut
		if clen < p.min { // cut-point skipping: no cut before min
			k := min(p.min-clen, int64(len(b)))
			c.cdcPos += k
			b = b[k:]
			continue
		}
		n := min(p.max-clen, int64(len(b)))
		cut, h := -1, c.h
		if clen < p.avg {
			cut, h = gearScan(h, b[:min(n, p.avg-clen)], p.maskS)
			if cut < 0 && n > p.avg-clen {
				var k int
				k, h = gearScan(h, b[p.avg-clen:n], p.maskL)
				if k >= 0 {
					cut = int(p.avg-clen) + k
				}
			}
		} else {
			cut, h = gearScan(h, b[:n], p.maskL)
		}
		if cut < 0 && clen+n == p.max {
			cut = int(n)
		}
		if cut < 0 {
			c.h = h
			c.cdcPos += n
			b = b[n:]
			continue
		}
		c.cdcPos += int64(cut)
		c.emit(c.cdcPos)
		b = b[cut:]
	}
}

// emit ends a chunk at pos (if it is non-empty).
func (c *Chunker) emit(pos int64) {
	if pos > c.lastCut {
		c.out = append(c.out, pos)
		dtype := ""
		if c.isData {
			dtype = c.dtype
		}
		c.outType = append(c.outType, dtype)
		c.lastCut = pos
	}
	c.h = 0
}

// wait makes step run once n bytes are pending (or at EOF).
func (c *Chunker) wait(n int, step stepFunc) {
	c.need, c.step = n, step
}

// claimRun claims the next n bytes as a non-data run of kind, then runs then.
func (c *Chunker) claimRun(n int64, kind SegmentKind, then stepFunc) {
	c.need, c.step = 0, then
	if n <= 0 {
		return
	}
	c.segs.add(c.done, n, kind, "")
	c.claim, c.isData = n, false
}

// Edge chunks of a data segment. torch.load reads each storage record's
// local header (30 bytes, through a buffer of st_blksize bytes, 4 KiB on
// ckptfs) before it maps the file, and the kernel reads whole pages: each
// probe touches up to 4 KiB before the header (the previous record's last
// bytes; the header is 16 or 24 bytes of data descriptor after them) and up
// to 8 KiB after the record's data starts (issue #13). Cutting those bytes
// into chunks of their own keeps a probe from loading two 1 MiB chunks of
// tensor data. Every format cuts its data segments the same way (issue #26):
// the same tensor in a torch zip and in a safetensors file (an export) then
// yields the same chunks, and a safetensors or GGUF reader that touches the
// header's last page, or a page next to a tensor boundary, loads at most an
// edge chunk of the tensor beside it.
const (
	edgeHead = 8 << 10
	edgeTail = 4 << 10
)

// claimData claims the next n bytes as one data segment, then runs then.
// A segment of at least minDataChunk bytes starts and ends at a cut and is
// cut by one rule, relative to its first byte, whatever the format: if it
// is longer than both edges (and maxChunk above the head edge), its first
// edgeHead and last edgeTail bytes are chunks of their own and the bytes
// between are cut every maxChunk bytes from the end of the head; otherwise
// it is cut every maxChunk bytes from its start. A smaller segment is
// CDC-cut with its neighbours.
func (c *Chunker) claimData(n int64, dtype string, then stepFunc) {
	c.need, c.step = 0, then
	if n <= 0 {
		return
	}
	if n < minDataChunk {
		c.segs.add(c.done, n, KindData, dtype)
		c.claim, c.isData = n, false
		return
	}
	if c.cdcPos > c.done {
		// cutPending took bytes for metadata that turn out to be data: only
		// a malformed file gets here. Its cuts stay valid as CDC cuts.
		c.fail()
		return
	}
	c.emit(c.done) // a data segment starts a chunk
	c.segs.add(c.done, n, KindData, dtype)
	c.claim, c.isData, c.dtype = n, true, dtype
	c.dataEnd = c.done + n
	c.dataNext = min(c.done+c.maxChunk, c.dataEnd)
	c.dataTail = 0
	if c.maxChunk > edgeHead && n > edgeHead+edgeTail {
		c.dataNext = c.done + edgeHead
		c.dataTail = c.dataEnd - edgeTail
	}
}

// claimRest claims everything up to EOF as a run of kind. complete says
// whether the format allows the file to end anywhere from here.
func (c *Chunker) claimRest(kind SegmentKind, complete bool) {
	c.claim, c.isData = -1, false
	c.restStart, c.restKind, c.complete = c.done, kind, complete
	c.need, c.step = 0, nil
}

// fail gives up parsing: the rest of the file is CDC-cut and the index
// will be unknown.
func (c *Chunker) fail() {
	c.failed = true
	c.claimRest(KindOther, false)
}

// stepQueue claims the queued items one by one, then runs c.after.
func stepQueue(c *Chunker, b []byte, eof bool) {
	if len(c.queue) == 0 {
		c.need, c.step = 0, c.after
		return
	}
	it := c.queue[0]
	c.queue = c.queue[1:]
	if it.kind == KindData {
		c.claimData(it.n, it.dtype, stepQueue)
	} else {
		c.claimRun(it.n, it.kind, stepQueue)
	}
}

// stepExpectEOF accepts only the end of the file.
func stepExpectEOF(c *Chunker, b []byte, eof bool) {
	if len(b) == 0 {
		if eof {
			c.claimRest(KindOther, true)
		} else {
			c.wait(1, stepExpectEOF)
		}
		return
	}
	c.fail() // trailing bytes
}

// stepSniff picks the format from the first bytes.
func stepSniff(c *Chunker, b []byte, eof bool) {
	switch sniff(b) {
	case fmtSafetensors:
		c.format = fmtSafetensors
		n := binary.LittleEndian.Uint64(b)
		if n > maxHeaderSize {
			c.fail()
			return
		}
		c.metaEnd = c.done + 8 + int64(n)
		c.wait(8+int(n), stepSafetensors)
	case fmtGGUF:
		c.format = fmtGGUF
		c.wait(4096, stepGGUF)
	case fmtNPY:
		c.format = fmtNPY
		c.wait(12, stepNPY)
	case "zip":
		c.wait(30, stepZipLocal)
	default:
		if sc, format := sniffParts(b); sc != nil {
			c.format = format
			c.parts = &partState{sc: sc, group: min(partGroup, c.p.min)}
			c.claimRest(KindMeta, false)
			return
		}
		c.claimRest(KindOther, true)
	}
}

func stepSafetensors(c *Chunker, b []byte, eof bool) {
	n := 8 + int64(binary.LittleEndian.Uint64(b))
	if int64(len(b)) < n {
		c.fail()
		return
	}
	tensors, _, err := parseSafetensorsHeader(b[8:n])
	if err != nil {
		c.fail()
		return
	}
	c.tensors = tensors
	for _, t := range tensors {
		c.queue = append(c.queue, claimItem{t.Length, KindData, t.DType})
	}
	c.after = stepExpectEOF
	c.claimRun(n, KindMeta, stepQueue)
}

func stepGGUF(c *Chunker, b []byte, eof bool) {
	h, need, err := parseGGUFHeader(b)
	if err != nil {
		c.fail()
		return
	}
	if need > 0 {
		if eof {
			c.fail()
			return
		}
		// The header goes on to need at least: those bytes are metadata.
		c.metaEnd = max(c.metaEnd, c.done+need)
		c.wait(int(min(max(need, int64(headerAhead(len(b)))), maxHeaderSize)), stepGGUF)
		return
	}
	c.tensors = h.tensors
	pos := h.infoEnd
	for _, t := range h.tensors {
		if t.Length == 0 {
			continue
		}
		c.queue = append(c.queue, claimItem{t.Offset - pos, KindOther, ""}, claimItem{t.Length, KindData, t.DType})
		pos = t.Offset + t.Length
	}
	c.after = func(c *Chunker, b []byte, eof bool) { c.claimRest(KindOther, true) }
	c.claimRun(h.infoEnd, KindMeta, stepQueue)
}

// headerAhead is how many bytes to parse a header of unknown length again
// with after n were not enough: twice as many, but at most headerStep more.
func headerAhead(n int) int {
	return n + min(max(n, 64), headerStep)
}

func stepNPY(c *Chunker, b []byte, eof bool) {
	h, need, err := parseNPYHeader(b)
	if err != nil || need > 0 && eof {
		c.fail()
		return
	}
	if need > 0 {
		c.wait(need, stepNPY)
		return
	}
	if h.nbytes < 0 {
		c.claimRun(h.hdrLen, KindMeta, func(c *Chunker, b []byte, eof bool) { c.claimRest(KindOther, true) })
		return
	}
	c.tensors = []Tensor{{DType: h.dtype, Shape: h.shape, Offset: h.hdrLen, Length: h.nbytes}}
	c.queue = []claimItem{{h.nbytes, KindData, h.dtype}}
	c.after = stepExpectEOF
	c.claimRun(h.hdrLen, KindMeta, stepQueue)
}

// index builds the Index that Close returns.
func (c *Chunker) index() *Index {
	if IsPartFormat(c.format) && !c.failed {
		if c.parts == nil || !c.parts.sc.complete() || c.claim > 0 {
			return unknownIndex(c.off)
		}
		c.complete = true
	}
	if c.failed || !c.complete || c.format == "" {
		return unknownIndex(c.off)
	}
	c.segs.add(c.restStart, c.off-c.restStart, c.restKind, "")
	ix := &Index{Format: c.format, Segments: c.segs.segs, Tensors: c.tensors}
	if c.parts != nil {
		ix.Tensors = c.parts.sc.parts()
	}
	if c.format == fmtTorch {
		if c.zip.tp == nil {
			return unknownIndex(c.off)
		}
		ts, err := torchTensors(c.zip.tp, c.zip.recs)
		if err != nil {
			return unknownIndex(c.off)
		}
		ix.Tensors = ts
		if c.zip.narchives > 0 {
			if c.zip.ntensors+len(ts) > maxSeqTensors {
				return unknownIndex(c.off)
			}
			ix.Format, ix.Tensors = fmtDistcp, archiveTensors(append(c.zip.archives, ts))
		}
	}
	if checkTensorBounds(ix, c.off) != nil {
		return unknownIndex(c.off)
	}
	sortTensors(ix.Tensors)
	return ix
}
