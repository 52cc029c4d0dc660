// Package tiered is a backend.Backend decorator: a local backend in front
// of a remote one, the read side of a store's remote tier. The model is
// restic's internal/backend/cache: the decorator knows bytes and names,
// not what they mean.
//
// Get reads the local backend; on a miss it fetches from the remote, keeps
// a copy locally (not synced: a copy lost or torn by a crash is fetched
// again) and returns it. Every other operation (Put, Sync, Stat, List,
// Delete) is the local backend's alone: the tier never writes to the
// remote (cas/remote does, on the remote backend itself), and Stat does
// not count the remote's objects, so a writer never skips writing a chunk
// it has only remotely.
//
// # Invariants
//
//   - The tier does not verify what it fetches: its caller does (cas
//     decodes and hashes every object it reads) and reports a damaged copy
//     with Refetch (drop it, fetch again) or Drop (keep none).
//   - Copies the tier fetched are bounded by Options.CacheSize, least
//     recently fetched first out; the newest always stays. Evictions go to
//     the function set with OnEvict (cas's, which leaves alone a copy a
//     commit in flight is about to name), or else are deleted locally.
//     Copies fetched by an earlier process count once the owner hands them
//     to Adopt at start (cmd/ckptfs does), so the bound holds across
//     restarts.
//   - TierStats counts bytes fetched, and (through SetPending and Settled,
//     called by cas/remote's upload rounds) bytes pending upload and
//     uploaded, for the store's statistics.
package tiered
