package catalog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/ckptfs/ckptfs/cas/object"
)

// Node is the catalog record of one namespace entry: a directory, a regular file
// (whose content is the manifest stored under the same Ino) or a symlink.
type Node struct {
	Ino    uint64
	Mode   uint32 // type and permission bits, as in stat(2)
	UID    uint32
	GID    uint32
	Size   int64 // regular files: committed size; symlinks: len(Target)
	Atime  int64 // nanoseconds since the epoch
	Mtime  int64
	Ctime  int64
	Target string // symlink target
	Rdev   uint32 // character and block devices: the device number, as in stat(2)
	// Nlink is the number of directory entries that name the node, for
	// every type but directories (whose count is their subdirectories';
	// the catalog keeps 1). Only Tx.AddLink and Tx.DropLink change it:
	// PutNode keeps the count the record has. Snapshots of the remote tier
	// do not carry it (a file with two names is two entries there).
	Nlink uint32 `json:"-"`
}

// Node records: version 1 is a node with one name; version 2 (written only
// for a node with several names, in a store at formatLinks) adds the link
// count after the fixed fields, before the symlink target or device number.
const (
	nodeRecordVersion      = 1
	nodeRecordVersionLinks = 2
)

func (n *Node) marshal() []byte {
	b := make([]byte, 0, 65+len(n.Target))
	if n.Nlink > 1 {
		b = append(b, nodeRecordVersionLinks)
	} else {
		b = append(b, nodeRecordVersion)
	}
	b = binary.LittleEndian.AppendUint32(b, n.Mode)
	b = binary.LittleEndian.AppendUint32(b, n.UID)
	b = binary.LittleEndian.AppendUint32(b, n.GID)
	b = binary.LittleEndian.AppendUint64(b, uint64(n.Size))
	b = binary.LittleEndian.AppendUint64(b, uint64(n.Atime))
	b = binary.LittleEndian.AppendUint64(b, uint64(n.Mtime))
	b = binary.LittleEndian.AppendUint64(b, uint64(n.Ctime))
	if n.Nlink > 1 {
		b = binary.LittleEndian.AppendUint32(b, n.Nlink)
	}
	if n.IsDevice() {
		// The tail a symlink's target takes: an older binary, which reads
		// it as a target, ignores it for a node that is no symlink.
		return binary.LittleEndian.AppendUint32(b, n.Rdev)
	}
	b = append(b, n.Target...)
	return b
}

func unmarshalNode(ino uint64, b []byte) (Node, error) {
	fixed := 1 + 4*3 + 8*4
	if len(b) > 0 && b[0] == nodeRecordVersionLinks {
		fixed += 4
	}
	if len(b) < fixed || b[0] != nodeRecordVersion && b[0] != nodeRecordVersionLinks {
		return Node{}, fmt.Errorf("node %d: bad record (%d bytes)", ino, len(b))
	}
	n := Node{Ino: ino, Nlink: 1}
	n.Mode = binary.LittleEndian.Uint32(b[1:])
	n.UID = binary.LittleEndian.Uint32(b[5:])
	n.GID = binary.LittleEndian.Uint32(b[9:])
	n.Size = int64(binary.LittleEndian.Uint64(b[13:]))
	n.Atime = int64(binary.LittleEndian.Uint64(b[21:]))
	n.Mtime = int64(binary.LittleEndian.Uint64(b[29:]))
	n.Ctime = int64(binary.LittleEndian.Uint64(b[37:]))
	if b[0] == nodeRecordVersionLinks {
		n.Nlink = binary.LittleEndian.Uint32(b[45:])
		if n.Nlink < 2 || n.IsDir() {
			return Node{}, fmt.Errorf("node %d: link count %d in a record of several names", ino, n.Nlink)
		}
	}
	if n.IsDevice() {
		if len(b) != fixed+4 {
			return Node{}, fmt.Errorf("node %d: device record of %d bytes", ino, len(b))
		}
		n.Rdev = binary.LittleEndian.Uint32(b[fixed:])
		return n, nil
	}
	n.Target = string(b[fixed:])
	return n, nil
}

// IsDir, IsRegular and IsSymlink report the node's type. IsSpecial reports a
// FIFO, socket or device node (no content: the kernel gives it its
// semantics), IsDevice a character or block device.
func (n *Node) IsDir() bool     { return n.Mode&0o170000 == 0o040000 }
func (n *Node) IsRegular() bool { return n.Mode&0o170000 == 0o100000 }
func (n *Node) IsSymlink() bool { return n.Mode&0o170000 == 0o120000 }
func (n *Node) IsDevice() bool {
	t := n.Mode & 0o170000
	return t == 0o020000 || t == 0o060000
}
func (n *Node) IsSpecial() bool {
	switch n.Mode & 0o170000 {
	case 0o010000, 0o020000, 0o060000, 0o140000:
		return true
	}
	return false
}

// ChunkRef is one entry of a manifest: Len raw bytes of chunk ID.
type ChunkRef struct {
	ID  ID
	Len uint32
}

// Manifest is a file's committed content: its chunks in file order, and the
// holes between them (runs of zeros that name no chunk). Extra holds
// format-specific data (a tensor index) that cas stores but does not
// interpret.
type Manifest struct {
	Chunks []ChunkRef
	Holes  []Hole // sorted by Before, at most one per place (holes.go)
	Extra  []byte
}

const (
	manifestVersion      = 1 // chunks and extra
	manifestVersionHoles = 2 // chunks, extra, then holes (formatHoles)
)

// Marshal returns m's record, unsealed (the catalog seals it with its key;
// the remote tier's snapshots carry it as it is). ParseManifest reads it.
// A manifest without holes has the record older binaries read; one with
// holes has version 2, which they refuse (and the store's format says so
// before they try: PutManifest).
func (m *Manifest) Marshal() []byte {
	b := make([]byte, 0, 1+10+len(m.Chunks)*(IDSize+5)+10+len(m.Extra)+len(m.Holes)*12)
	v := byte(manifestVersion)
	if len(m.Holes) > 0 {
		v = manifestVersionHoles
	}
	b = append(b, v)
	b = binary.AppendUvarint(b, uint64(len(m.Chunks)))
	for _, c := range m.Chunks {
		b = binary.AppendUvarint(b, uint64(c.Len))
		b = append(b, c.ID[:]...)
	}
	b = binary.AppendUvarint(b, uint64(len(m.Extra)))
	b = append(b, m.Extra...)
	if v == manifestVersionHoles {
		b = appendHoles(b, m.Holes)
	}
	return b
}

// ParseManifest decodes a record that Manifest.Marshal made, checking its
// lengths strictly.
func ParseManifest(b []byte) (*Manifest, error) {
	if len(b) < 1 || (b[0] != manifestVersion && b[0] != manifestVersionHoles) {
		return nil, errors.New("bad manifest version")
	}
	r := bytes.NewReader(b[1:])
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return nil, fmt.Errorf("manifest chunk count: %w", err)
	}
	if n > uint64(len(b))/(IDSize+1) {
		return nil, fmt.Errorf("manifest claims %d chunks in %d bytes", n, len(b))
	}
	m := &Manifest{Chunks: make([]ChunkRef, n)}
	for i := range m.Chunks {
		l, err := binary.ReadUvarint(r)
		if err != nil || l > object.MaxChunkSize {
			return nil, fmt.Errorf("manifest chunk %d: bad length", i)
		}
		m.Chunks[i].Len = uint32(l)
		if _, err := r.Read(m.Chunks[i].ID[:]); err != nil {
			return nil, fmt.Errorf("manifest chunk %d: %w", i, err)
		}
	}
	el, err := binary.ReadUvarint(r)
	if err != nil || el > uint64(r.Len()) {
		return nil, errors.New("manifest extra: bad length")
	}
	if el > 0 {
		m.Extra = make([]byte, el)
		_, _ = r.Read(m.Extra) // length checked above
	}
	if b[0] == manifestVersionHoles {
		if m.Holes, err = readHoles(r, len(m.Chunks)); err != nil {
			return nil, err
		}
		if r.Len() != 0 {
			return nil, fmt.Errorf("manifest: %d bytes past its holes", r.Len())
		}
	}
	return m, nil
}

// ChunkInfo is the chunk index record of one stored chunk.
//
// A chunk is stored either as an object of its own (Pack is zero) or inside
// a pack (packs.go): its object's StoredLen bytes at Offset in pack Pack.
// Record version 1 (10 bytes) is the first; version 2 (46 bytes) adds the
// pack and offset, and is written only for packed chunks, so an unpacked
// row reads the same to an older ckptfs. Version 3 (10 bytes, the fields
// of version 1) is a chunk stored inline: its object is in the catalog's
// inline bucket (inline.go).
type ChunkInfo struct {
	RawLen    uint32
	StoredLen uint32 // size of the object, header included (in its pack when packed)
	Codec     Codec
	Pack      ID     // the pack holding the object; zero: an object file of its own
	Offset    uint32 // where the object starts in Pack
	Inline    bool   // the object is in the catalog (inline.go); Pack is zero
}

// Packed reports whether the chunk's object lives in a pack.
func (c ChunkInfo) Packed() bool { return c.Pack != ID{} }

func (c ChunkInfo) marshal() []byte {
	b := make([]byte, 0, 46)
	v := byte(1)
	switch {
	case c.Packed():
		v = 2
	case c.Inline:
		v = inlineRecVersion
	}
	b = append(b, v)
	b = binary.LittleEndian.AppendUint32(b, c.RawLen)
	b = binary.LittleEndian.AppendUint32(b, c.StoredLen)
	b = append(b, byte(c.Codec))
	if c.Packed() {
		b = append(b, c.Pack[:]...)
		b = binary.LittleEndian.AppendUint32(b, c.Offset)
	}
	return b
}

func unmarshalChunkInfo(b []byte) (ChunkInfo, error) {
	if !(len(b) == 10 && (b[0] == 1 || b[0] == inlineRecVersion)) && !(len(b) == 46 && b[0] == 2) {
		return ChunkInfo{}, errors.New("bad chunk record")
	}
	c := ChunkInfo{
		RawLen:    binary.LittleEndian.Uint32(b[1:]),
		StoredLen: binary.LittleEndian.Uint32(b[5:]),
		Codec:     Codec(b[9]),
		Inline:    b[0] == inlineRecVersion,
	}
	if b[0] == 2 {
		copy(c.Pack[:], b[10:42])
		c.Offset = binary.LittleEndian.Uint32(b[42:])
		if !c.Packed() {
			return ChunkInfo{}, errors.New("bad chunk record: version 2 without a pack")
		}
	}
	return c, nil
}
