// Package formats recognises ML checkpoint file formats and cuts files into
// chunks for ckptfs's content-addressed store. It imports no other ckptfs
// package.
//
// # Job
//
// Two entry points share one set of parsers:
//
//   - Parse reads a complete file through an io.ReaderAt and returns its
//     Index: the format, the file's segments (metadata, one data segment per
//     tensor or torch storage record, other bytes) and its tensors (name,
//     dtype, shape, byte range).
//   - A Chunker follows a file as it is written, in order, and cuts it into
//     chunks while it learns the same Index from the stream. It sits on the
//     FUSE write path.
//
// Formats: safetensors; torch.save zip files (data.pkl plus data/<key>
// storage records); "distcp": torch.save archives one after another, as
// torch.distributed.checkpoint's FileSystemWriter writes a rank's shard
// (each archive a whole zip with offsets from its own first byte; the
// tensors numbered "0", "1", ... in the shard's order, counting only the
// archives that hold tensors, "k.<name>" inside a dict, since the keys are
// only in the .metadata written after the shards: ParseDCPMetadata reads
// them for the CLI); GGUF v2/v3; .npy; .npz (stored members). OCDBT data
// files (orbax-checkpoint's) and other files of zstd frames are cut at
// every frame and node but keep an unknown index (zstdframes.go). Tree models and
// pickles are part formats (issue #29): XGBoost JSON and UBJ
// ("xgboost-json", "xgboost-ubj"), LightGBM text models ("lightgbm"), and
// pickles ("pickle": pickle.dump of any object, sklearn models included, and
// joblib.dump files). Anything else, including the legacy non-zip torch
// format (pickles followed by raw storages), is unknown (Format "").
//
// # Chunking invariants
//
//   - A data segment of at least 4 KiB always starts and ends at a cut and
//     is cut by one rule relative to its first byte, in every format: if it
//     is longer than 12 KiB (and maxChunk above 8 KiB), its first 8 KiB and
//     last 4 KiB are chunks of their own and the bytes between are cut every
//     maxChunk bytes from the end of the first 8 KiB; otherwise it is cut
//     every maxChunk bytes from its start. The same tensor bytes therefore
//     give the same chunks at any file offset and in any format (a torch
//     storage record holding one whole tensor, a safetensors, GGUF, npy or
//     npz tensor): exporting a torch.save checkpoint to safetensors stores
//     almost nothing new (issue #26). A change inside one tensor changes
//     only that tensor's chunks. Data bytes cost O(1) work per chunk: offset
//     arithmetic, never hashing.
//   - The edge chunks serve torch.load, which reads every record's local
//     header through a 4 KiB buffer while the kernel reads the pages around
//     it: a lazy torch.load(mmap=True) loads ~12 KiB per record instead of
//     two 1 MiB chunks of tensor data (issue #13). Until issue #26 only
//     torch records had them. That changed the cuts of every other format's
//     data segments larger than 12 KiB: files written since then share no
//     data chunks with the same tensors written before (one full copy of each
//     such tensor after an upgrade). Stored files keep their chunks: reading
//     never depends on the cutter.
//   - Smaller data segments (a chunk is a store object: 10^6 scalars must
//     not cost 10^6 of them) are cut with the bytes around them, which
//     differ between containers (zip headers in torch, neighbour tensors in
//     safetensors), so a tensor under 4 KiB rarely shares its chunk across
//     formats. That costs at most the small tensors' own bytes plus their
//     neighbours, a small share of any checkpoint whose bytes are mostly
//     in tensors of 4 KiB or more; consumers that compare tensors should
//     hash such tensors' bytes rather than their chunks.
//   - Those small segments and all other bytes (headers, pickles, zip
//     records, padding, unknown formats, anything after the point where a
//     stream stopped parsing) are cut by FastCDC (gear hash, normalized chunking, min 8 KiB, avg 32 KiB,
//     max min(128 KiB, maxChunk)), so unchanged parts of unknown formats
//     still deduplicate after insertions. The gear table is fixed: changing
//     it moves cut points and stops new chunks from matching old ones.
//   - Part formats are followed by streaming scanners (parts.go) that see
//     every byte once, keep a few bytes of token state (a pickle's stack
//     model is capped; see picklevm.go) and add cuts to the CDC ones: the
//     skeleton (tree counts, parameters, pickle opcodes around the arrays)
//     and the trees never share a chunk, and trees (each entry of XGBoost's
//     learner.gradient_booster.model.trees, each LightGBM "Tree=N" block,
//     each pickled buffer of 256 bytes or more) group into chunks of at
//     least 2 KiB (partGroup) counted from the last forced cut, so a tree a
//     later save keeps byte for byte keeps its chunks. Forced cuts: around
//     the tree list, around every pickle FRAME header (its length changes
//     when a later save appends to the frame), around pickled buffers of
//     2 KiB or more, and where lightgbm's Python package appends to the
//     file its library wrote. A pickled buffer of 4 KiB or more (an
//     in-band ndarray, a joblib array) is a data segment, cut like a
//     tensor. A warm-started save then costs its new trees, its skeleton
//     and about one group of trees: 10 saves of +50 trees store 1.005x
//     (XGBoost JSON) to 1.08x (sklearn pickle) the final file, against
//     1.2x-2.5x by CDC alone.
//   - Cuts depend only on the file's bytes, never on how writes split them.
//   - The cuts lag the bytes written by at most MaxLag(maxChunk) (~9 MiB
//     for 1 MiB chunks), whatever the header size: bytes a parser still needs
//     but already knows to be metadata (a safetensors header of known length,
//     a torch data.pkl or GGUF header that goes on past them) are cut by
//     content as they arrive, while a copy waits for the parser; a header
//     whose end is unknown is parsed again every 8 MiB. A writer that keeps
//     uncut bytes in memory therefore never waits on a header.
//   - A write is never refused: odd, broken or hostile input degrades to
//     CDC and an Index with Format "".
//   - When a Chunker reports a format, Parse of the same bytes returns the
//     same Index. A Chunker may give up where Parse succeeds: it cannot
//     follow a compressed zip member whose size is only in the data
//     descriptor after its data.
//
// # Index conventions
//
// Offsets are absolute file offsets. Segments tile [0, size) in order;
// adjacent non-data segments of one kind are merged; empty tensors have no
// segment. Tensor shapes are in C order for every format (GGUF's ne[] is
// reversed). Tensors are sorted by offset, then name. DType strings are
// canonical lower-case names ("f32", "bf16", "f8_e4m3", "q4_k", ...; see
// DTypeBits); numpy types without one keep their descr ("<U3", ">f4").
//
// Per format:
//
//   - safetensors: [0, 8+N) meta, then each tensor's data. Validation
//     follows the reference implementation: header ≤ 100 MB, UTF-8 JSON
//     object, no duplicate keys, offsets contiguous from 0 with no holes or
//     overlaps, byte length = dtype size × elements, file size exact.
//   - torch: one data segment per stored data/<key> record (a storage, which
//     several tensors may view: tied weights, views, slices); everything
//     else is meta. Tensor names are the key path of the unpickled object
//     joined with "." ("model.layer.0.weight", "state.0.exp_avg"); a bare
//     tensor is named "". A tensor's range is its storage offset plus the
//     span of its strides, so a non-contiguous view covers its gaps.
//   - gguf: [0, end of tensor infos) meta, tensor data, padding "other".
//   - npy: header meta, then the array's data (other for object arrays).
//   - npz: each stored member's array data is a data segment named by the
//     member without ".npy"; local headers, .npy headers, compressed members
//     and the central directory are meta.
//   - part formats: Tensors lists parts, not tensors: "tree.N" (DType
//     DTypeTree) for XGBoost and LightGBM, "buffer.N" (DType DTypeBuffer)
//     for pickles, in file order. Trees and buffers under 4 KiB lie in
//     meta segments (the file is meta but for its data segments); a buffer
//     of 4 KiB or more is exactly one data segment. Parse runs a Chunker over
//     the file, so the two agree; a file that only starts like a part
//     format (the sniff is weak: "{\"learner\"", UBJ's "{L...learner",
//     "tree\nversion", a pickle PROTO) is unknown, never an error.
//
// # Torch pickles are interpreted, never executed
//
// data.pkl runs in gopickle's VM with hooks: FindClass allows only
// torch._utils/_tensor rebuild functions (recorded, not run), torch storage
// classes and dtypes, collections.OrderedDict/defaultdict/Counter, a few
// inert torch/numpy/builtins names (torch.device, torch.Size, numpy scalar
// reconstruction, ...), and rejects every other global with an error (so a
// pickled nn.Module fails to parse and is CDC-cut); PersistentLoad turns
// ('storage', class, key, location, numel) into a record. Before the VM
// runs, an opcode scan requires every length to lie inside the pickle and
// caps the opcodes (2^20: ~40k tensors, ~250 MB of VM memory at worst), the
// MARK depth and integer and line sizes; the object walk caps depth and
// visits (shared sub-objects, cycles).
//
// # Pickles are scanned, never executed
//
// The pickle part scanner walks opcodes with the same argument table as
// the torch scan and skips their arguments as they stream past. To step
// over joblib's arrays (written outside the opcodes after each
// NumpyArrayWrapper: padding length, padding, elements; or a nested pickle
// for object arrays) it models the pickle machine's stack: ints, strings of
// up to 40 bytes, tuples of up to 16 scalars, globals by name, numpy.dtype
// reductions and the wrapper's state; everything else is opaque. Nothing is
// called or imported. The model holds at most 2^14 stack values, 2^14 memo
// entries and 8 nested pickles; past those, or on any opcode it does not
// know, the scan stops and the rest of the file is CDC-cut.
//
// # Limits
//
// Headers (safetensors JSON, GGUF metadata and tensor infos, data.pkl) are
// capped at 100 MB, .npy headers at 1 MiB, zips at 2^20 entries, ranks at
// 64 dims; every count read from a file is checked against the bytes that
// could hold it before anything is allocated. A Chunker buffers only bytes
// it must parse before it can place them, so its memory is bounded by these
// caps (plus its Index), never by the file size.
package formats
