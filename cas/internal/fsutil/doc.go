// Package fsutil holds the two file-system helpers that the store's own
// directory code (cas) and the local object backend (cas/backend/local)
// share: fsyncing a directory (SyncDir), and opening a file while the
// process is out of descriptors by waiting for one (OpenRetry,
// IsFDExhausted).
//
// It exists so that cas need not import a concrete backend for them. It
// holds only stateless helpers that know nothing of objects, handles or
// the store's layout; anything that does belongs in cas or in a backend.
package fsutil
