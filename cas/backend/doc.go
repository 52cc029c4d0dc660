// Package backend is the seam between ckptfs's chunk store (package cas) and
// the places its objects live: the store's local objects/ directory
// (cas/backend/local), memory for tests (cas/backend/mem), and an
// S3-compatible bucket (cas/backend/s3); cas/backend/tiered composes two
// (local first, remote on a miss: the remote tier's read side, a Tier).
//
// Who implements it: cas/backend/local and cas/backend/mem are written with
// the seam (remote-seam, issue #14); cas/backend/s3 by the S3 work (remote-s3,
// issue #14). Every implementation must pass the conformance suite in
// cas/backend/backendtest:
//
//	func TestConformance(t *testing.T) {
//		backendtest.Run(t, func(t testing.TB) backend.Backend { return newBackend(t) })
//	}
//
// Only cas, cas/remote (the remote tier's write side) and cmd/ckptfs (to
// construct the backends) import this package and its sub-packages; fusefs and gc never see object names or paths. This package
// imports nothing from ckptfs and only the standard library.
//
// # Objects
//
// An object is an immutable byte string named by a Handle: its Kind and a
// Name. Chunk and manifest names are the lower-case hex of a 32-byte content
// hash; whatever is stored under one name decodes to the same content, so a
// copy of an object never needs invalidating, and a Put over an existing
// object (the background re-encoder does that: same raw bytes, another codec)
// replaces it atomically with an equivalent one. Lock objects are the
// exception: small, named by a word, rewritten by their holder (the remote
// tier's writer lock).
//
// Objects are whole byte slices, never streams: chunks are bounded (64 MiB at
// most, 1 MiB by default), read whole, and a slice can be retried without
// rewinding anything. There are no ranged reads, no multipart uploads.
//
// # Durability: Put, then Sync
//
// Put makes an object visible; Sync makes it durable. A backend whose Put is
// durable on return (S3: a PUT answered 200 is stored) says so in
// Properties.DurableOnPut, and its Sync only reports objects it knows to be
// missing. The local directory defers durability: Put writes and renames the
// file and starts its writeback; Sync fdatasyncs many objects at once
// (through the descriptors that wrote them) and fsyncs their directories, so
// the filesystem groups them into a few journal commits (that grouping is why
// the contract has two steps; restic and kopia make every Save durable and
// pay one journal commit per object). The caller's rule: no catalog row may
// name an object before a Sync naming it returned nil.
//
// A failed Sync is sticky: the kernel reports a failed writeback once, so the
// backend remembers it, every later Sync naming the object fails, and Stat and
// Get report the object as not existing (ErrNotExist) until it is Put again:
// its bytes cannot be trusted to survive a crash, so the caller must write it
// anew rather than reuse it.
//
// # Put-if-absent
//
// PutOptions.IfAbsent makes Put fail with an error wrapping ErrExists, and
// change nothing, when the name already holds an object (S3: If-None-Match: *;
// local: link(2)). For chunks an ErrExists is a dedup hit, not a failure. The
// remote writer lock is taken with it: of several concurrent IfAbsent Puts of
// one handle exactly one succeeds.
//
// # Errors
//
// Missing objects give errors wrapping ErrNotExist, refused conditional writes
// errors wrapping ErrExists; callers test with errors.Is. Any other error may
// be transient; IsPermanent tells a retry loop when to give up.
//
// # Concurrency
//
// Every method is safe for concurrent use, including concurrent Puts of the
// same handle (the last rename or PUT wins, and all write equivalent bytes)
// and a Get concurrent with a Put of the same handle (it sees the old object
// or the new one, whole). List calls its callback on the caller's goroutine.
// Every call takes a context.Context and gives up with ctx.Err() once ctx is
// done, so a reader of a slow remote can be interrupted.
package backend
