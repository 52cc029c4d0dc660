package formats

// dtypeBits maps each canonical plain element type to its width in bits.
var dtypeBits = map[string]int{
	"bool": 8,
	"u8":   8, "i8": 8, "u16": 16, "i16": 16, "u32": 32, "i32": 32, "u64": 64, "i64": 64,
	"f16": 16, "bf16": 16, "f32": 32, "f64": 64,
	"c32": 32, "c64": 64, "c128": 128,
	"f8_e4m3": 8, "f8_e5m2": 8, "f8_e8m0": 8, "f8_e4m3fnuz": 8, "f8_e5m2fnuz": 8,
	"f6_e2m3": 6, "f6_e3m2": 6, "f4": 4,
	// torch quantized and packed storages
	"qi8": 8, "qu8": 8, "qi32": 32, "qu4x2": 8, "qu2x4": 8, "f4_e2m1_x2": 8,
	"bits8": 8, "bits16": 16, "bits1x8": 8, "bits2x4": 8, "bits4x2": 8,
}

// DTypeBits returns the width in bits of one element of a canonical dtype
// (Tensor.DType, Segment.DType), e.g. 16 for "bf16" and 4 for "f4". It
// returns 0 for types that are not a fixed per-element width: GGUF block
// quantizations ("q4_0", "q6_k", ... whose sizes are per block of 32 or 256
// elements), native numpy spellings, and unknown names.
func DTypeBits(dtype string) int {
	return dtypeBits[dtype]
}

// safetensorsDTypes lists the dtype strings of the safetensors spec with
// their canonical names.
var safetensorsDTypes = map[string]string{
	"BOOL": "bool", "U8": "u8", "I8": "i8", "U16": "u16", "I16": "i16",
	"U32": "u32", "I32": "i32", "U64": "u64", "I64": "i64",
	"F16": "f16", "BF16": "bf16", "F32": "f32", "F64": "f64", "C64": "c64",
	"F8_E4M3": "f8_e4m3", "F8_E5M2": "f8_e5m2", "F8_E8M0": "f8_e8m0",
	"F8_E4M3FNUZ": "f8_e4m3fnuz", "F8_E5M2FNUZ": "f8_e5m2fnuz",
	"F6_E2M3": "f6_e2m3", "F6_E3M2": "f6_e3m2", "F4": "f4",
}

// torchStorageDTypes maps legacy typed-storage class names (module torch)
// to canonical dtypes. UntypedStorage counts bytes and has no dtype.
var torchStorageDTypes = map[string]string{
	"DoubleStorage": "f64", "FloatStorage": "f32", "HalfStorage": "f16",
	"BFloat16Storage": "bf16", "LongStorage": "i64", "IntStorage": "i32",
	"ShortStorage": "i16", "CharStorage": "i8", "ByteStorage": "u8",
	"BoolStorage": "bool", "ComplexFloatStorage": "c64",
	"ComplexDoubleStorage": "c128", "QInt8Storage": "qi8",
	"QUInt8Storage": "qu8", "QInt32Storage": "qi32",
	"QUInt4x2Storage": "qu4x2", "QUInt2x4Storage": "qu2x4",
}

// torchDTypes maps torch dtype attribute names (module torch, as pickled
// for _rebuild_tensor_v3) to canonical dtypes.
var torchDTypes = map[string]string{
	"float64": "f64", "double": "f64", "float32": "f32", "float": "f32",
	"float16": "f16", "half": "f16", "bfloat16": "bf16",
	"int64": "i64", "long": "i64", "int32": "i32", "int": "i32",
	"int16": "i16", "short": "i16", "int8": "i8", "uint8": "u8",
	"uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "bool",
	"complex32": "c32", "chalf": "c32", "complex64": "c64", "cfloat": "c64",
	"complex128": "c128", "cdouble": "c128",
	"float8_e4m3fn": "f8_e4m3", "float8_e5m2": "f8_e5m2",
	"float8_e4m3fnuz": "f8_e4m3fnuz", "float8_e5m2fnuz": "f8_e5m2fnuz",
	"float8_e8m0fnu": "f8_e8m0", "float4_e2m1fn_x2": "f4_e2m1_x2",
	"qint8": "qi8", "quint8": "qu8", "qint32": "qi32",
	"quint4x2": "qu4x2", "quint2x4": "qu2x4",
	"bits8": "bits8", "bits16": "bits16", "bits1x8": "bits1x8",
	"bits2x4": "bits2x4", "bits4x2": "bits4x2",
}

// npyDTypes maps little-endian numpy descr strings to canonical dtypes.
var npyDTypes = map[string]string{
	"<f8": "f64", "<f4": "f32", "<f2": "f16",
	"<i8": "i64", "<i4": "i32", "<i2": "i16", "|i1": "i8",
	"<u8": "u64", "<u4": "u32", "<u2": "u16", "|u1": "u8",
	"|b1": "bool", "<c8": "c64", "<c16": "c128",
}

// ggmlType describes a GGUF tensor type: its canonical name and its block
// size in elements and bytes (ggml-common.h static_asserts).
type ggmlType struct {
	name  string
	blk   int64
	bytes int64
}

// ggmlTypes is indexed by the GGUF type id; removed ids are zero.
var ggmlTypes = map[uint32]ggmlType{
	0: {"f32", 1, 4}, 1: {"f16", 1, 2},
	2: {"q4_0", 32, 18}, 3: {"q4_1", 32, 20},
	6: {"q5_0", 32, 22}, 7: {"q5_1", 32, 24},
	8: {"q8_0", 32, 34}, 9: {"q8_1", 32, 36},
	10: {"q2_k", 256, 84}, 11: {"q3_k", 256, 110},
	12: {"q4_k", 256, 144}, 13: {"q5_k", 256, 176},
	14: {"q6_k", 256, 210}, 15: {"q8_k", 256, 292},
	16: {"iq2_xxs", 256, 66}, 17: {"iq2_xs", 256, 74},
	18: {"iq3_xxs", 256, 98}, 19: {"iq1_s", 256, 50},
	20: {"iq4_nl", 32, 18}, 21: {"iq3_s", 256, 110},
	22: {"iq2_s", 256, 82}, 23: {"iq4_xs", 256, 136},
	24: {"i8", 1, 1}, 25: {"i16", 1, 2}, 26: {"i32", 1, 4}, 27: {"i64", 1, 8},
	28: {"f64", 1, 8}, 29: {"iq1_m", 256, 56}, 30: {"bf16", 1, 2},
	34: {"tq1_0", 256, 54}, 35: {"tq2_0", 256, 66}, 39: {"mxfp4", 32, 17},
}
