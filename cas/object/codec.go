package object

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Codec identifies how a chunk's payload is encoded. The value is stored in the
// object header, so existing values must never change meaning.
type Codec uint8

// Codecs. New codecs get new numbers; old ones stay decodable forever.
const (
	CodecRaw       Codec = 0 // payload is the raw bytes
	CodecZstd      Codec = 1 // payload is one zstd frame
	CodecByteGroup Codec = 2 // payload is byte planes of 2- or 4-byte elements (bytegroup.go)
)

func (c Codec) String() string {
	switch c {
	case CodecRaw:
		return "raw"
	case CodecZstd:
		return "zstd"
	case CodecByteGroup:
		return "bytegroup"
	}
	return fmt.Sprintf("codec(%d)", uint8(c))
}

// Hint tells the encoder what a chunk holds.
//
// ElemSize is the element width in bytes of the tensor the chunk was cut from,
// when the chunk starts at an element boundary: 2 for bf16/fp16 (and other
// 16-bit types), 4 for fp32. The encoder then tries byte grouping (each byte
// position of the elements becomes a plane, coded on its own), and keeps the
// smallest of that, zstd and raw. 0 (and any other width) means unknown or not a
// tensor: zstd or raw. A wrong hint costs ratio and speed, never correctness.
type Hint struct {
	ElemSize int
}

// Coder holds the encoder and decoder state of one store. It is safe for
// concurrent use: klauspost's Encoder.EncodeAll and Decoder.DecodeAll are, and
// the byte-group scratch comes from pools owned by this instance.
type Coder struct {
	zenc *zstd.Encoder
	// zsmall encodes inputs of at most smallInput bytes (small files'
	// inline chunks, packed chunks, samples), one encoder per core: zenc
	// runs one EncodeAll at a time, and a 4 KiB encode queued behind a
	// 4 MiB one waited 7.7 ms (p50; 13 µs alone).
	zsmall *zstd.Encoder
	zdec   *zstd.Decoder
	bg     bgPools
	// permBufs holds *[]byte scratch for decoding classed deltas (delta.go).
	permBufs sync.Pool
	// classGain is the fraction of the best plain delta's size a classed
	// delta must save to be chosen (appendDeltaPayload).
	classGain float64
}

// smallInput is the largest input zsmall encodes; its window is as large,
// so that it finds every match zenc would.
const smallInput = 64 << 10

func NewCoder() (*Coder, error) {
	opts := []zstd.EOption{
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		// At the fast levels klauspost's zstd skips entropy coding of literals
		// in blocks without matches, which leaves float weights uncompressed;
		// forcing it gives ~0.78 on bf16 and ~0.93 on fp32.
		zstd.WithAllLitEntropyCompression(true),
		zstd.WithZeroFrames(true),
		zstd.WithEncoderCRC(false), // the object header carries a CRC of the payload
	}
	enc, err := zstd.NewWriter(nil, append(opts, zstd.WithEncoderConcurrency(1))...)
	if err != nil {
		return nil, fmt.Errorf("zstd encoder: %w", err)
	}
	small, err := zstd.NewWriter(nil, append(opts, zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)),
		zstd.WithWindowSize(smallInput))...)
	if err != nil {
		enc.Close()
		return nil, fmt.Errorf("zstd encoder: %w", err)
	}
	dec, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(0),
		zstd.WithDecoderMaxMemory(1<<30),
		zstd.WithDecodeAllCapLimit(true)) // never decode past the raw length
	if err != nil {
		return nil, fmt.Errorf("zstd decoder: %w", err)
	}
	return &Coder{zenc: enc, zsmall: small, zdec: dec, classGain: deltaClassGain}, nil
}

// zstdFor returns the encoder for an input of n bytes.
func (c *Coder) zstdFor(n int) *zstd.Encoder {
	if n <= smallInput {
		return c.zsmall
	}
	return c.zenc
}

func (c *Coder) Close() {
	c.zenc.Close()
	c.zsmall.Close()
	c.zdec.Close()
}

// minSaving is the fraction of a chunk an encoding must save to be kept; below
// it the chunk is stored raw, which decodes at memcpy speed.
const minSaving = 1.0 / 32

// zstdSample is how many bytes of a byte-grouped chunk zstd tries, to tell
// data with long-range repeats (where zstd beats byte grouping) from weights.
const zstdSample = 8 << 10

// appendEncoded picks the codec for raw and appends its payload to dst.
func (c *Coder) appendEncoded(dst, raw []byte, h Hint) (Codec, []byte) {
	if len(raw) == 0 {
		return CodecRaw, dst
	}
	base := len(dst)
	keep := func(n int) bool { return float64(n) <= float64(len(raw))*(1-minSaving) }
	if h.ElemSize == 2 || h.ElemSize == 4 {
		if bg, ok := c.appendByteGroup(dst, raw, h.ElemSize); ok {
			n := len(bg) - base
			ratio := float64(n) / float64(len(raw))
			tryZstd := ratio > 1-bgKeepSaving // byte grouping found little
			if !tryZstd && ratio > 0.05 && len(raw) > 2*zstdSample {
				// Does a sample look far more compressible to zstd?
				mid := (len(raw) - zstdSample) / 2
				z := c.zstdFor(zstdSample).EncodeAll(raw[mid:mid+zstdSample], make([]byte, 0, zstdSample))
				tryZstd = float64(len(z)) < 0.8*ratio*zstdSample
			}
			if tryZstd {
				z := c.zstdFor(len(raw)).EncodeAll(raw, nil)
				if len(z) < n && keep(len(z)) {
					return CodecZstd, append(bg[:base], z...)
				}
			}
			if keep(n) {
				return CodecByteGroup, bg
			}
			return CodecRaw, append(bg[:base], raw...)
		}
	}
	z := c.zstdFor(len(raw)).EncodeAll(raw, dst)
	if keep(len(z) - base) {
		return CodecZstd, z
	}
	return CodecRaw, append(z[:base], raw...)
}

// decode decodes payload into a new buffer of exactly rawLen bytes.
func (c *Coder) decode(codec Codec, payload []byte, rawLen int) ([]byte, error) {
	return c.decodeInto(codec, payload, rawLen, nil)
}

// decodeInto is decode into a buffer of rawLen bytes from alloc (nil: make).
// The result never aliases payload.
func (c *Coder) decodeInto(codec Codec, payload []byte, rawLen int, alloc func(int) []byte) ([]byte, error) {
	if alloc == nil {
		alloc = func(n int) []byte { return make([]byte, n) }
	}
	switch codec {
	case CodecRaw:
		if len(payload) != rawLen {
			return nil, fmt.Errorf("raw payload is %d bytes, header says %d", len(payload), rawLen)
		}
		out := alloc(rawLen)
		copy(out, payload)
		return out, nil
	case CodecZstd:
		out, err := c.zdec.DecodeAll(payload, alloc(rawLen)[:0])
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		if len(out) != rawLen {
			return nil, fmt.Errorf("zstd payload decoded to %d bytes, header says %d", len(out), rawLen)
		}
		return out, nil
	case CodecByteGroup:
		out := alloc(rawLen)
		if err := c.decodeByteGroup(out, payload); err != nil {
			return nil, err
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown codec %d", uint8(codec))
}
