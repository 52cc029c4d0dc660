package backend

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Kind is what an object holds; each backend lays kinds out as it likes.
type Kind uint8

// The kinds of object.
const (
	// Chunk is one chunk object (cas's header plus encoded payload), named by
	// the BLAKE3-256 of the chunk's raw bytes. Local layout:
	// objects/ab/cd/<60 hex> (unchanged since the first store); s3:
	// PREFIX/chunks/ab/cd/<60 hex>.
	Chunk Kind = 1
	// Manifest is one committed file version as the remote tier publishes it,
	// named by the BLAKE3-256 of its bytes (s3: PREFIX/manifests/<64 hex>).
	Manifest Kind = 2
	// Lock is a small mutable object named by a word (s3: PREFIX/locks/NAME):
	// the remote tier's writer lease ("writer": taken with an IfAbsent Put,
	// rewritten as a heartbeat), its log ("log.<seq>": create-only entries)
	// and a hint to the log's tail ("head"). cas/remote/doc.go has the
	// protocol.
	Lock Kind = 3
	// Pack is many chunk objects back to back (cas's packs of small chunks),
	// named by the BLAKE3-256 of its bytes. Local layout: objects/packs/<64
	// hex>. Packs stay in the local store: the remote tier uploads the
	// chunks in them as chunk objects. Read in ranges (RangeGetter).
	Pack Kind = 4
)

// Kinds lists every Kind, for suites and listings.
var Kinds = []Kind{Chunk, Manifest, Lock}

// String names the kind as layouts and messages do ("chunks", "manifests", "locks").
func (k Kind) String() string {
	switch k {
	case Chunk:
		return "chunks"
	case Manifest:
		return "manifests"
	case Lock:
		return "locks"
	case Pack:
		return "packs"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Handle names one object.
type Handle struct {
	Kind Kind
	// Name is the lower-case hex of a 32-byte hash for Chunk and Manifest, and
	// 1 to 64 characters of [a-z0-9._-] (not starting with '.') for Lock.
	Name string
}

func (h Handle) String() string { return h.Kind.String() + "/" + h.Name }

// Valid reports whether h is a handle a backend must accept (see Handle.Name).
// Backends refuse others with an error, never touching anything.
func (h Handle) Valid() bool {
	switch h.Kind {
	case Chunk, Manifest, Pack:
		if len(h.Name) != 64 {
			return false
		}
		for i := 0; i < len(h.Name); i++ {
			c := h.Name[i]
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return false
			}
		}
		return true
	case Lock:
		if len(h.Name) == 0 || len(h.Name) > 64 || h.Name[0] == '.' {
			return false
		}
		for i := 0; i < len(h.Name); i++ {
			c := h.Name[i]
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z' || c == '.' || c == '_' || c == '-') {
				return false
			}
		}
		return true
	}
	return false
}

// Info describes a stored object.
type Info struct {
	Handle Handle
	Size   int64
	// ModTime is when the object was last Put (local: the file's mtime, which
	// PutOptions.ModTime may set; s3: the server's LastModified). Garbage
	// collection's grace period counts from it.
	ModTime time.Time
}

// Properties describe what a backend guarantees, so callers branch on
// capabilities instead of assuming the weakest.
type Properties struct {
	// Connections is how many operations are worth issuing at once (local
	// 16, s3 more): it sizes the caller's worker pools.
	Connections int
	// DurableOnPut: a Put that returned nil is durable; Sync only reports
	// objects that are missing.
	DurableOnPut bool
	// AtomicPut: no torn or partial object is ever visible under a name, even
	// after a crash (s3). Without it (local) an object that no Sync covered
	// may be damaged after a crash, and must be verified before it is reused.
	AtomicPut bool
	// KeepsModTime: PutOptions.ModTime is honoured (local). Otherwise ModTime
	// is the time of the Put (s3: the server's clock).
	KeepsModTime bool
	// Remote: operations cross a network; reads may be slow and cost money.
	Remote bool
}

// PutOptions modify Put.
type PutOptions struct {
	// IfAbsent: fail with an error wrapping ErrExists, changing nothing, when
	// the handle already names an object.
	IfAbsent bool
	// ModTime, when not zero and the backend KeepsModTime, becomes the
	// object's ModTime (the re-encoder keeps the grace clock of the object it
	// replaces).
	ModTime time.Time
}

// Errors a backend reports (wrapped: test with errors.Is).
var (
	// ErrNotExist: no object has that handle (or its Sync failed; see above).
	ErrNotExist = errors.New("backend: object does not exist")
	// ErrExists: a Put with IfAbsent found an object already there.
	ErrExists = errors.New("backend: object already exists")
)

// Backend stores immutable objects. See the package documentation for the
// contracts every method shares (errors, concurrency, durability).
type Backend interface {
	// Location names where the objects live, for messages and the catalog's
	// record of where a store keeps its objects: a directory path, or
	// s3://BUCKET/PREFIX (with the endpoint if not AWS's). Never credentials.
	Location() string

	// Properties describe the backend; they do not change while it is open.
	Properties() Properties

	// Put stores obj under h, replacing any object there atomically unless
	// opts.IfAbsent (then ErrExists). obj is not retained or modified. The
	// object is visible to Get, Stat and List when Put returns nil; it is
	// durable after a Sync naming it (or on return if DurableOnPut). A failed
	// Put leaves the old object (or none) in place and no debris that List
	// reports.
	Put(ctx context.Context, h Handle, obj []byte, opts PutOptions) error

	// Sync makes durable every object in hs, whoever Put it (this process, an
	// earlier one, another batch). After Sync returns nil no crash loses them.
	// An object in hs that does not exist is an error wrapping ErrNotExist.
	// A failed sync is sticky (see the package documentation). Safe to call
	// concurrently with overlapping hs.
	Sync(ctx context.Context, hs []Handle) error

	// Get returns h's whole object, read into buf when buf's capacity is
	// enough and into a new slice otherwise; the result aliases nothing else.
	Get(ctx context.Context, h Handle, buf []byte) ([]byte, error)

	// Stat describes h's object.
	Stat(ctx context.Context, h Handle) (Info, error)

	// Delete removes h's object. A missing object is not an error.
	Delete(ctx context.Context, h Handle) error

	// List calls fn for every object of kind k, in no particular order, on
	// the caller's goroutine; an error from fn stops the listing and is
	// returned. Objects Put or deleted meanwhile may or may not be seen;
	// debris (temporary files of interrupted Puts) is never reported.
	List(ctx context.Context, k Kind, fn func(Info) error) error

	// IsPermanent reports whether retrying the operation that returned err
	// cannot help (a missing object, ErrExists, access denied, a full disk,
	// a cancelled context).
	IsPermanent(err error) bool

	// Close releases the backend's resources. Objects Put but not synced may
	// be lost by a crash afterwards, never damaged by Close itself.
	Close() error
}

// Janitor is implemented by backends that can leave debris behind (the local
// directory's temporary files after a crash). RemoveStale deletes debris last
// modified before before and says how much it removed.
type Janitor interface {
	RemoveStale(ctx context.Context, before time.Time) (removed int, err error)
}

// RangeGetter is implemented by backends that read part of an object (the
// local directory and mem): cas stores packs only in one.
type RangeGetter interface {
	// GetRange returns n bytes of h's object from offset off, read into buf
	// when its capacity is enough. A range past the object's end is an
	// error (io.ErrUnexpectedEOF); a missing object wraps ErrNotExist.
	GetRange(ctx context.Context, h Handle, off, n int64, buf []byte) ([]byte, error)
}

// CheckHandle returns an error naming h when it is not Valid. Implementations
// call it first in every method taking a handle.
func CheckHandle(h Handle) error {
	if !h.Valid() {
		return fmt.Errorf("backend: invalid handle %d/%q", uint8(h.Kind), h.Name)
	}
	return nil
}

// Tier is implemented by a backend that fronts a slower one with a local
// cache of the objects it fetched from it (cas/backend/tiered): Get reads
// the local copy, and on a miss fetches from the remote and keeps a copy.
// The tier does not verify what it fetches; its caller does (cas decodes
// and hashes every object it reads), and tells the tier about a damaged
// copy through Refetch and Drop.
type Tier interface {
	Backend
	// Remote is the backend behind the local one.
	Remote() Backend
	// Refetch replaces the local copy of h, found damaged by the caller,
	// with a fresh one fetched from the remote, and returns its bytes
	// (read into buf when it is large enough).
	Refetch(ctx context.Context, h Handle, buf []byte) ([]byte, error)
	// Drop deletes the local copy of h (a fetched copy that failed the
	// caller's checks even when fetched again): it is not kept.
	Drop(ctx context.Context, h Handle) error
	// OnEvict sets what deletes the fetched copies the tier's budget
	// evicts (by default it deletes them from the local backend itself):
	// cas sets a function that leaves alone the copies a commit in flight
	// is about to name. Set once, before the tier is used.
	OnEvict(fn func(ctx context.Context, hs []Handle))
	// TierStats returns the tier's traffic counters.
	TierStats() TierStats
}

// TierStats counts a Tier's traffic since it was made: bytes fetched, and
// the counters of the upload rounds that write back to it (cas/remote).
type TierStats struct {
	PendingBytes  int64 // raw bytes of committed chunks not in the remote yet (as of the last round)
	UploadedBytes int64 // object bytes uploaded
	ReadBytes     int64 // object bytes fetched
}
