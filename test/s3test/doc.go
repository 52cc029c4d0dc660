// Package s3test runs a real S3-compatible server for tests, bound to
// 127.0.0.1 on a free port, with its own credentials and one bucket:
// versitygw (the Versity S3 Gateway, Apache-2.0) serving a temporary
// directory, or, with CKPTFS_S3_SERVER=moto, moto's server (Apache-2.0, in
// memory). It also has a fault-injecting reverse proxy to put between a
// client and that server.
//
// The versitygw binary is built once by test/tools.sh into
// $CKPTFS_TOOLS/bin (default $HOME/.cache/ckptfs/tools/bin), and moto is
// installed into $CKPTFS_TOOLS/moto-venv; CI runs that script, so a missing
// server fails the test with a message saying how to get it. It is never
// skipped. What each server supports is in cas/backend/s3's package doc
// (moto, for one, accepts any secret: tests of bad credentials are for
// versitygw).
//
// moto keeps its objects in process memory, so a Server of kind Moto puts a
// TCP front on the endpoint's port: Stop closes the front (dials are
// refused, open connections reset, as when a server dies) and Restart opens
// it again, while the process and its objects live on. Pause and Resume
// (SIGSTOP, SIGCONT) stop either server's process: it accepts connections
// and answers nothing.
//
// # Server
//
// Start gives a running server whose bucket exists. Stop kills it the way a
// crash would (SIGKILL); Restart starts it again on the same directory and the
// same port, so clients configured with its endpoint keep working and see
// every object written before the stop. Env returns the AWS_* variables
// (endpoint, keys, region, and empty shared config files, so that the
// developer's ~/.aws never leaks into a test) for a subprocess such as the
// ckptfs daemon.
//
// versitygw v1.8.0 (posix backend) was checked to honour the conditional
// headers ckptfs relies on: PutObject with If-None-Match: * answers
// 412 PreconditionFailed when the key exists and exactly one of many
// concurrent conditional PUTs of a new key wins (the others get 412; see
// cas/backend/s3's tests). Its posix backend keeps object metadata in
// extended attributes, so the temporary directory must be on a filesystem with
// user xattrs (ext4, xfs, tmpfs on Linux ≥ 6.6).
//
// # Faults
//
// NewProxy puts a reverse proxy on 127.0.0.1 in front of a server. Its rules
// answer chosen requests with an HTTP error, delay them, truncate or corrupt
// the bodies of responses (or of uploads, on their way to the server), hang
// up, or strip the conditional headers and sign the request again
// (IgnoreConditions: a server without conditional writes). Tests use it to show that clients fail within a bounded time and never
// report damaged data as success.
package s3test
