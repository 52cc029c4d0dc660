package catalog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Catalog records carry a checksum (store format 2). Every value of the
// nodes, manifests, chunks, dirents and reencode buckets is
//
//	0x02 | record | CRC-32C of (key ‖ 0x02 ‖ record), u32 little-endian
//
// where record is the format-1 value (a node, manifest, chunk or queue record
// starting with its own version byte 1; a dirent's 8-byte inode number). One
// damaged byte, in the value or in its key, thus makes the record an error
// (wrapping ErrCatalogDamaged) instead of a different record: a manifest
// naming other chunks or lengths, a node with another size or mode, an entry
// pointing at another inode. Decoders also check lengths strictly.
//
// Format-1 values (unsealed) are read only from a store still at format 1,
// opened read-only; Open migrates a writable one (every row sealed in one
// transaction, then format 2). No format-1 value starts with 0x02. An older
// ckptfs refuses a format-2 store (ErrNewerFormat) rather than misread its
// records. The meta bucket (format, chunk size, counters) is not sealed: a
// damaged counter misstates statistics, never file content.
const recordVersion = 2

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// sealRecord returns 0x02 ‖ rec ‖ CRC-32C(key ‖ 0x02 ‖ rec).
func sealRecord(key, rec []byte) []byte {
	v := make([]byte, 0, 1+len(rec)+4)
	v = append(v, recordVersion)
	v = append(v, rec...)
	c := crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, v)
	return binary.LittleEndian.AppendUint32(v, c)
}

// openRecord checks a sealed value and returns the record inside. In a
// format-1 store (t.legacy) an unsealed value is the record itself.
func (t *raw) openRecord(key, v []byte) ([]byte, error) {
	if len(v) >= 5 && v[0] == recordVersion {
		c := crc32.Update(crc32.Checksum(key, castagnoli), castagnoli, v[:len(v)-4])
		if c != binary.LittleEndian.Uint32(v[len(v)-4:]) {
			return nil, fmt.Errorf("%w: record %x: checksum mismatch", ErrCatalogDamaged, key)
		}
		return v[1 : len(v)-4], nil
	}
	if t.legacy {
		return v, nil
	}
	return nil, fmt.Errorf("%w: record %x: not sealed (%d bytes)", ErrCatalogDamaged, key, len(v))
}

// errDamaged wraps a record decoding error.
func errDamaged(err error) error {
	if err == nil || errors.Is(err, ErrCatalogDamaged) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrCatalogDamaged, err)
}
