package cas

import "fmt"

// Writing deltas (issue #15). Who decides what, and the rows that say so:
//
//   - The filesystem knows which chunk a new chunk is likely close to (the
//     same tensor range in the file's previous version, or in the same file
//     of the previous step directory) and says so with Batch.SuggestBase
//     before it commits. cas decides the rest.
//   - The commit that indexes a new chunk with a suggestion turns it into a
//     plan, in the same transaction: the bucket "deltaplans" (chunk → base,
//     distance), and a re-encode queue row. The base is the suggested
//     chunk's own base when that chunk is a delta, so that every delta of a
//     run points at one standalone keyframe, at a distance one more than
//     the suggestion's; when the suggestion is only planned to be a delta,
//     the plan names the suggestion itself, and what it becomes decides
//     (below). At distance Options.DeltaKeyframe the new chunk gets no plan
//     and becomes the next keyframe. Depth 1 holds by construction, and is
//     checked again when the delta is written.
//   - With Options.DeltaLatestWhole a plan waits for a later version of
//     its chunk (a "deltawait" row, no queue row) so that the newest
//     version stays whole. Every commit releases the plans of the chunks
//     its suggestions name (Deltas.Release: the row is marked released, a
//     queue row comes), whether its own chunk is new, planned or not, and
//     whatever the options say now. A rename that takes the file out of
//     its run releases them too (Deltas.ReleaseIn, called by fusefs), and
//     the transaction that deletes or replaces the file's content drops
//     those of its chunks the new content does not name (Deltas.Forget):
//     doc.go has why. The row keeps, as a fallback base, the
//     keyframe the chain led to when the plan was made: a waiting plan
//     names the version before it (below), never yet a delta, and a
//     collection of that version (a rotation) would otherwise leave it no
//     way to the keyframe. The re-encoder gives a waiting chunk its
//     standalone encoding only and keeps its plan; a release that comes
//     while it does leaves the queue row for the next round. An older
//     ckptfs ignores the bucket (no format change): it never releases a
//     waiting plan (its fsck calls the plan stale), so that chunk stays
//     whole unless it was stored raw and queued, when the older
//     re-encoder carries the plan out; the wait rows its re-encodes and
//     collections leave behind fsck notes (delta-wait-stale), and a plan
//     made again for the chunk replaces them.
//   - A plan does not keep its base: a collection keeps the bases of
//     delta rows only. A rotation that deletes the save a queued plan's
//     keyframe belongs to, followed by a collection before the background
//     re-encoder ran, sweeps that keyframe and leaves the planned chunk
//     whole; the chain goes on from it as from a keyframe (its later
//     versions are coded against it). That is the cheaper outcome, not a
//     loss to close: keeping a keyframe no file uses would cost its whole
//     size to save the difference between the planned chunk's standalone
//     and delta encodings, and the chains after it are as short either
//     way (TestDeltaSweptKeyframeRestartsChain: 4 bf16 versions of 128
//     KiB, 158 KB stored after the sweep, 199 KB with the keyframe kept).
//     A keyframe that a file still uses is marked by that file. Waiting
//     moves the moment from a save's commit to the next save's.
//   - The re-encoder (reencode.go) carries a plan out: it encodes the chunk
//     against a base and keeps the delta only when it is smaller than the
//     best standalone encoding by more than 1/32; it skips a base that a
//     sample of elements says cannot pay (object.DeltaMayPay: an unrelated
//     chunk). The bases it tries, in
//     order (catalog.Tx.PlanCandidates): the keyframe the plans lead to,
//     then the chunks on the way, standalone as long as their own plans
//     have not paid. Plans used to name the suggestion's planned keyframe
//     outright; when that plan did not pay (a new run's first save,
//     suggested against the previous run's file of the same name, which
//     fusefs finds one directory level up), every later save of the run
//     was planned against the unrelated chunk and none became a delta
//     until the next keyframe (make bench step 9 measured its second and
//     third rounds without a delta). Before
//     it renames the delta object into place it commits the delta's rows:
//     "deltas" (chunk → base, distance) and the reverse index "bases"
//     (base ‖ chunk), and moves the store to format 3 (an older ckptfs
//     refuses the store rather than sweep a base it does not know is used).
//     A crash after that transaction and before the rename leaves a delta
//     row over a standalone object: harmless (the base is kept a little
//     longer), the queue row is still there, and the next re-encode of the
//     chunk settles it either way.
//   - The remote tier's upload round carries out the plans of the chunks
//     it uploads (Store.ReencodeQueued) rather than wait for the
//     re-encoder, since it uploads each object as it is (cas/remote). A
//     waiting plan is not carried out there: that chunk goes up whole, and
//     stays whole in the bucket after it becomes a delta here (so a mount
//     with a remote plans at once by default).
//   - A base is never swept while any delta row names it (Sweep checks
//     "bases" in its transaction), so no delta loses its base whatever the
//     collector marked; a sweep that deletes a delta and its base deletes
//     the delta's rows and object first.
//   - A delta is written only against a base that has no delta row, and
//     only for a chunk that is no delta's base: both checked in the
//     transaction that writes the rows, and re-encodes are serialised.
//
// The rows live in the catalog (cas/catalog/deltas.go): plans are written
// by Tx.Deltas().Plan at commit, delta rows by the re-encoder.

// SettleDeltaWaits tidies the deltawait rows when a mount starts
// (catalog.Deltas.Settle): it drops the rows an older ckptfs left without
// their chunk or plan, and without Options.DeltaLatestWhole it releases
// every plan that waits, so that a store mounted with --delta-latest delta
// after whole codes the saves that waited too, as that mode promises,
// instead of keeping them whole until a later version of each comes. Not
// done by Open: a tool that opens a store without a mount's options (gc,
// fsck) must not release what a mount keeps waiting. It returns how many
// rows it dropped and released.
func (s *Store) SettleDeltaWaits() (dropped, released int, err error) {
	if s.readOnly {
		return 0, 0, nil
	}
	err = s.Update(func(tx *Tx) error {
		var err error
		dropped, released, err = tx.Deltas().Settle(!s.deltaWait)
		return err
	})
	if err != nil {
		return dropped, released, fmt.Errorf("settle delta waits: %w", err)
	}
	return dropped, released, nil
}

// DefaultDeltaKeyframe is Options.DeltaKeyframe's default: a delta chain
// restarts with a standalone chunk every fifth version. Measured on
// test/delta/workload.py at the codec level (stored ÷ logical, bf16/fp32):
// keyframe 2: .475/.739, 3: .438/.721, 4: .419/.712, 5: .416/.711,
// 10: .436/.721, 20: .496/.750 — farther deltas code worse, nearer
// keyframes cost more standalone chunks; 5 is the minimum for both.
const DefaultDeltaKeyframe = 5
