package formats

// The Chunker's zip container steps (torch.save archives and npz): local
// headers, data descriptors, data.pkl, npz members and the central directory.
// Each step claims its bytes as metadata or as one data segment and names the
// next step; a malformed archive falls back to content-defined cutting.

import (
	"encoding/binary"
	"strings"
)

// zipStream is the Chunker's state inside a torch zip or an npz.
type zipStream struct {
	// base is where the current archive starts in the file: 0, or past the
	// end of the archives before it in a sequence of torch.save archives
	// (see stepZipNext). Offsets the archive's own records hold (local
	// header offsets, the central directory's) are relative to base.
	base int64
	// archives are the tensors of the archives before the current one that
	// hold any, one list each, named as torchTensors names them; narchives
	// counts all those archives, ntensors the tensors in archives.
	archives            [][]Tensor
	narchives, ntensors int
	prefix              string // torch archive prefix, with the trailing "/"
	entries             int
	scan                pickleScan
	tp                  *torchPickle
	recs                map[string]recInfo // torch storage key -> record data range
	ents                []zipEntry         // local entries seen, in order
	names               map[string]bool
	cdSeen              int   // central directory entries checked
	zip64               bool  // a zip64 end record was seen, at zip64Off
	zip64Loc            bool  // and then its locator
	zip64Off            int64 // relative to base
	cdStart, cdEnd      int64 // central directory range, relative to base
	// current entry
	name    string
	hasDesc bool  // sizes follow the data in a data descriptor
	size    int64 // compressed size when !hasDesc
	method  uint16
	scanned int // bytes already searched for a descriptor
}

// stepZipSig dispatches on the signature at a record boundary.
func stepZipSig(c *Chunker, b []byte, eof bool) {
	if len(b) < 4 {
		c.fail()
		return
	}
	switch string(b[:4]) {
	case zipLocalSig:
		c.wait(30, stepZipLocal)
	case zipCentralSig, zip64EOCDSig, zip64LocSig, zipEOCDSig:
		stepZipCentral(c, b, eof)
	default:
		c.fail()
	}
}

// stepZipLocal parses a local file header.
func stepZipLocal(c *Chunker, b []byte, eof bool) {
	z := &c.zip
	if len(b) < 30 || string(b[:4]) != zipLocalSig {
		if z.entries == 0 && z.base == 0 {
			c.claimRest(KindOther, true) // not a zip after all
		} else {
			c.fail()
		}
		return
	}
	hl := 30 + int(binary.LittleEndian.Uint16(b[26:])) + int(binary.LittleEndian.Uint16(b[28:]))
	if len(b) < hl {
		if eof {
			c.fail()
		} else {
			c.wait(hl, stepZipLocal)
		}
		return
	}
	flags := binary.LittleEndian.Uint16(b[6:])
	z.method = binary.LittleEndian.Uint16(b[8:])
	csize := uint64(binary.LittleEndian.Uint32(b[18:]))
	usize := uint64(binary.LittleEndian.Uint32(b[22:]))
	nameLen := int(binary.LittleEndian.Uint16(b[26:]))
	z.name = string(b[30 : 30+nameLen])
	z.hasDesc = flags&0x8 != 0
	// A zip64 extra field (id 1) holds the sizes that read 0xFFFFFFFF.
	for extra := b[30+nameLen : hl]; len(extra) >= 4; {
		id, n := binary.LittleEndian.Uint16(extra), int(binary.LittleEndian.Uint16(extra[2:]))
		if 4+n > len(extra) {
			break
		}
		if id == 1 {
			f := extra[4 : 4+n]
			if usize == 0xFFFFFFFF && len(f) >= 8 {
				usize, f = binary.LittleEndian.Uint64(f), f[8:]
			}
			if csize == 0xFFFFFFFF && len(f) >= 8 {
				csize = binary.LittleEndian.Uint64(f)
			}
		}
		extra = extra[4+n:]
	}
	if !z.hasDesc && (csize > maxInt64 || z.method == 0 && csize != usize) {
		c.fail()
		return
	}
	z.size = int64(csize)
	if z.entries++; z.entries > maxZipEntries || z.names[z.name] {
		c.fail()
		return
	}
	if z.names == nil {
		z.names = make(map[string]bool)
	}
	z.names[z.name] = true
	z.ents = append(z.ents, zipEntry{name: z.name, lho: c.done - z.base, method: z.method, csize: -1, usize: -1})
	if !z.hasDesc {
		z.ents[len(z.ents)-1].csize, z.ents[len(z.ents)-1].usize = int64(csize), int64(min(usize, maxInt64))
	}
	if z.entries == 1 {
		kind, prefix := zipKind(z.name)
		switch {
		case z.base > 0 && kind != fmtTorch:
			c.fail() // only torch archives follow one another
			return
		case kind == "":
			c.claimRest(KindOther, true) // a zip of another kind: CDC
			return
		}
		c.format, z.prefix = kind, prefix
	}
	if c.format == fmtTorch && !strings.HasPrefix(z.name, z.prefix) {
		c.fail()
		return
	}
	var then stepFunc
	switch key, isData := strings.CutPrefix(z.name, z.prefix+"data/"); {
	case c.format == fmtTorch && z.entries == 1:
		if z.method != 0 {
			c.fail()
			return
		}
		then = func(c *Chunker, b []byte, eof bool) { c.wait(4096, stepTorchPickle) }
	case c.format == fmtTorch && isData && z.method == 0 && z.tp != nil:
		n := z.size
		if z.hasDesc {
			s, ok := z.tp.storages[key]
			if !ok {
				c.fail()
				return
			}
			n, _ = s.nbytes()
		}
		if _, dup := z.recs[key]; dup {
			c.fail()
			return
		}
		z.recs[key] = recInfo{c.done + int64(hl), n, true}
		z.ents[len(z.ents)-1].csize, z.ents[len(z.ents)-1].usize = n, n
		dtype := z.tp.dtypes[key]
		then = func(c *Chunker, b []byte, eof bool) { c.claimData(n, dtype, entryEnd(n)) }
	case c.format == fmtNPZ && strings.HasSuffix(z.name, ".npy") && z.method == 0:
		then = func(c *Chunker, b []byte, eof bool) { c.wait(12, stepNPZMember) }
	case !z.hasDesc:
		n := z.size
		then = func(c *Chunker, b []byte, eof bool) { c.claimRun(n, KindMeta, entryEnd(n)) }
	case z.method == 0:
		z.scanned = 0
		then = func(c *Chunker, b []byte, eof bool) { c.wait(64, stepZipScanDesc) }
	default:
		c.fail() // compressed, with its size after the data: cannot follow
		return
	}
	c.claimRun(int64(hl), KindMeta, then)
}

// entryEnd returns the step after an entry's n data bytes: its data
// descriptor, if it has one, then the next record.
func entryEnd(n int64) stepFunc {
	return func(c *Chunker, b []byte, eof bool) {
		if e := &c.zip.ents[len(c.zip.ents)-1]; e.csize < 0 {
			e.csize, e.usize = n, n // stored entry sized by the stream
		}
		if !c.zip.hasDesc {
			c.wait(4, stepZipSig)
			return
		}
		c.wait(28, func(c *Chunker, b []byte, eof bool) { stepZipDesc(c, b, eof, n) })
	}
}

// isZipSig reports whether b starts with a record signature that may follow
// a data descriptor.
func isZipSig(b []byte) bool {
	if len(b) < 4 {
		return false
	}
	switch string(b[:4]) {
	case zipLocalSig, zipCentralSig, zipEOCDSig, zip64EOCDSig:
		return true
	}
	return false
}

// descLen returns the length (16 or 24) of the data descriptor at the start
// of b for an entry of n stored bytes, or 0 if there is none. A descriptor
// is accepted only with its signature, matching sizes, and a record
// signature (or EOF) after it.
func descLen(b []byte, n int64, eof bool) int {
	if len(b) < 16 || string(b[:4]) != zipDescSig {
		return 0
	}
	follows := func(at int) bool { return len(b) == at && eof || isZipSig(b[at:]) }
	if n < 1<<32 && binary.LittleEndian.Uint32(b[8:]) == uint32(n) &&
		binary.LittleEndian.Uint32(b[12:]) == uint32(n) && follows(16) {
		return 16
	}
	if len(b) >= 24 && binary.LittleEndian.Uint64(b[8:]) == uint64(n) &&
		binary.LittleEndian.Uint64(b[16:]) == uint64(n) && follows(24) {
		return 24
	}
	return 0
}

// stepZipDesc consumes the data descriptor of an entry of n bytes.
func stepZipDesc(c *Chunker, b []byte, eof bool, n int64) {
	d := descLen(b, n, eof)
	if d == 0 {
		c.fail()
		return
	}
	c.claimRun(int64(d), KindMeta, func(c *Chunker, b []byte, eof bool) { c.wait(4, stepZipSig) })
}

// stepZipScanDesc finds the end of a small stored entry whose size is only
// in its data descriptor by searching for a descriptor that matches the
// distance to it.
func stepZipScanDesc(c *Chunker, b []byte, eof bool) {
	z := &c.zip
	// A descriptor at i is decided once b holds it and the signature after
	// it (i+28 bytes), or at EOF.
	limit := len(b) - 28
	if eof {
		limit = len(b) - 16
	}
	for i := z.scanned; i <= limit; i++ {
		if b[i] == 'P' && descLen(b[i:], int64(i), eof) > 0 {
			n := int64(i)
			c.claimRun(n, KindMeta, entryEnd(n))
			return
		}
		z.scanned = i + 1
	}
	if eof || len(b) >= maxDescScan {
		c.fail()
		return
	}
	c.wait(min(2*len(b)+64, maxDescScan+28), stepZipScanDesc)
}

// stepTorchPickle finds the end of data.pkl and interprets it.
func stepTorchPickle(c *Chunker, b []byte, eof bool) {
	z := &c.zip
	err := z.scan.scan(b)
	if err == errShort {
		if eof || len(b) >= maxHeaderSize {
			c.fail()
		} else {
			// The pickle goes on past b: b is metadata.
			c.metaEnd = max(c.metaEnd, c.done+int64(len(b)))
			c.wait(min(headerAhead(len(b)), maxHeaderSize), stepTorchPickle)
		}
		return
	}
	n := int64(z.scan.end)
	if err != nil || !z.hasDesc && n != z.size {
		c.fail()
		return
	}
	tp, err := loadTorchPickle(b[:n])
	if err != nil {
		c.fail()
		return
	}
	z.tp, z.recs = tp, make(map[string]recInfo, len(tp.storages))
	c.claimRun(n, KindMeta, entryEnd(n))
}

// stepNPZMember parses the .npy header at the start of an npz member.
func stepNPZMember(c *Chunker, b []byte, eof bool) {
	z := &c.zip
	h, need, err := parseNPYHeader(b)
	if err != nil || need > 0 && eof {
		c.fail()
		return
	}
	if need > 0 {
		c.wait(need, stepNPZMember)
		return
	}
	switch {
	case h.nbytes >= 0 && (z.hasDesc || h.hdrLen+h.nbytes == z.size):
		n := h.hdrLen + h.nbytes
		c.tensors = append(c.tensors, Tensor{Name: strings.TrimSuffix(z.name, ".npy"), DType: h.dtype,
			Shape: h.shape, Offset: c.done + h.hdrLen, Length: h.nbytes})
		c.queue = []claimItem{{h.nbytes, KindData, h.dtype}}
		c.after = entryEnd(n)
		c.claimRun(h.hdrLen, KindMeta, stepQueue)
	case h.nbytes < 0 && !z.hasDesc:
		n := z.size
		c.claimRun(n, KindMeta, entryEnd(n))
	default:
		c.fail()
	}
}

// zipEntry is what the Chunker saw of a local entry, to check against the
// central directory. Sizes are -1 until known.
type zipEntry struct {
	name         string
	lho          int64
	method       uint16
	csize, usize int64
}

const zip64LocSig = "PK\x06\x07"

// stepZipCentral checks the central directory and end records against the
// entries the stream had, so that the Chunker and Parse (archive/zip, which
// reads the central directory) agree on what the file holds.
func stepZipCentral(c *Chunker, b []byte, eof bool) {
	z := &c.zip
	le16 := func(i int) int { return int(binary.LittleEndian.Uint16(b[i:])) }
	le32 := func(i int) uint64 { return uint64(binary.LittleEndian.Uint32(b[i:])) }
	next := func(c *Chunker, b []byte, eof bool) { c.wait(4, stepZipCentral) }
	if len(b) < 4 {
		c.fail()
		return
	}
	var n int             // record length
	at := c.done - z.base // the record's offset in its archive
	switch string(b[:4]) {
	case zipCentralSig:
		if len(b) < 46 {
			c.wait(46, stepZipCentral)
			return
		}
		n = 46 + le16(28) + le16(30) + le16(32)
		if len(b) < n {
			c.wait(n, stepZipCentral)
			return
		}
		if z.cdSeen >= len(z.ents) || z.cdSeen > 0 && z.cdEnd != at {
			c.fail()
			return
		}
		if z.cdSeen == 0 {
			z.cdStart = at
		}
		z.cdEnd = at + int64(n)
		e := z.ents[z.cdSeen]
		z.cdSeen++
		usize, csize, lho := le32(24), le32(20), le32(42)
		nameEnd := 46 + le16(28)
		for extra := b[nameEnd : nameEnd+le16(30)]; len(extra) >= 4; {
			id, m := binary.LittleEndian.Uint16(extra), int(binary.LittleEndian.Uint16(extra[2:]))
			if 4+m > len(extra) {
				break
			}
			if id == 1 {
				f := extra[4 : 4+m]
				for _, v := range []*uint64{&usize, &csize, &lho} {
					if *v == 0xFFFFFFFF && len(f) >= 8 {
						*v, f = binary.LittleEndian.Uint64(f), f[8:]
					}
				}
			}
			extra = extra[4+m:]
		}
		if string(b[46:nameEnd]) != e.name || uint16(le16(10)) != e.method || int64(lho) != e.lho ||
			int64(csize) != e.csize || int64(usize) != e.usize {
			c.fail()
			return
		}
		c.claimRun(int64(n), KindMeta, next)
	case zip64EOCDSig:
		if len(b) < 12 {
			c.wait(12, stepZipCentral)
			return
		}
		// 44 bytes of fields, no extensible data (what every writer
		// leaves; Parse's walk back from the end needs the length).
		size := binary.LittleEndian.Uint64(b[4:])
		if size != 44 || z.zip64 {
			c.fail()
			return
		}
		if n = 12 + int(size); len(b) < n {
			c.wait(n, stepZipCentral)
			return
		}
		if binary.LittleEndian.Uint64(b[24:]) != uint64(len(z.ents)) || binary.LittleEndian.Uint64(b[32:]) != uint64(len(z.ents)) ||
			binary.LittleEndian.Uint64(b[40:]) != uint64(z.cdEnd-z.cdStart) || binary.LittleEndian.Uint64(b[48:]) != uint64(z.cdStart) {
			c.fail()
			return
		}
		z.zip64, z.zip64Off = true, at
		c.claimRun(int64(n), KindMeta, next)
	case zip64LocSig:
		if len(b) < 20 {
			c.wait(20, stepZipCentral)
			return
		}
		if !z.zip64 || z.zip64Loc || binary.LittleEndian.Uint64(b[8:]) != uint64(z.zip64Off) {
			c.fail()
			return
		}
		z.zip64Loc = true
		c.claimRun(20, KindMeta, next)
	case zipEOCDSig:
		if len(b) < 22 {
			c.wait(22, stepZipCentral)
			return
		}
		n = 22 + le16(20)
		count, size, off := le16(10), le32(12), le32(16)
		if z.cdSeen != len(z.ents) || z.zip64 != z.zip64Loc || count != len(z.ents)&0xFFFF && !(count == 0xFFFF && z.zip64) ||
			le16(8) != count || size != uint64(z.cdEnd-z.cdStart) && !(size == 0xFFFFFFFF && z.zip64) ||
			off != uint64(z.cdStart) && !(off == 0xFFFFFFFF && z.zip64) ||
			c.format == fmtTorch && z.tp == nil {
			c.fail()
			return
		}
		next := func(c *Chunker, b []byte, eof bool) { c.wait(1, stepExpectEOF) }
		if c.format == fmtTorch {
			next = func(c *Chunker, b []byte, eof bool) { c.wait(4, stepZipNext) }
		}
		c.claimRun(int64(n), KindMeta, next)
	default:
		c.fail()
	}
}

// stepZipNext runs after a torch archive's end record: the file ends there,
// or another torch archive starts. torch.distributed.checkpoint's .distcp
// files are such sequences: FileSystemWriter torch.save()s each item of a
// rank's shard into one stream, one archive after another, and records
// each one's offset and length in .metadata. Each archive is a whole zip
// whose own offsets count from its first byte.
func stepZipNext(c *Chunker, b []byte, eof bool) {
	z := &c.zip
	if len(b) == 0 && eof {
		c.claimRest(KindOther, true)
		return
	}
	if len(b) < 4 || string(b[:4]) != zipLocalSig || z.narchives >= maxArchives-1 {
		c.fail() // trailing bytes
		return
	}
	ts, err := torchTensors(z.tp, z.recs)
	if err != nil || z.ntensors+len(ts) > maxSeqTensors {
		c.fail()
		return
	}
	next := zipStream{base: c.done, archives: z.archives, narchives: z.narchives + 1, ntensors: z.ntensors + len(ts)}
	if len(ts) > 0 {
		next.archives = append(next.archives, ts)
	}
	c.zip = next
	c.wait(30, stepZipLocal)
}
