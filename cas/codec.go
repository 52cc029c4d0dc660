package cas

import (
	"fmt"

	"github.com/klauspost/compress/zstd"
)

// Codec identifies how a chunk's payload is encoded. The value is stored in the
// object header, so existing values must never change meaning.
type Codec uint8

// Codecs. New codecs get new numbers; old ones stay decodable forever.
const (
	CodecRaw  Codec = 0 // payload is the raw bytes
	CodecZstd Codec = 1 // payload is one zstd frame
)

func (c Codec) String() string {
	switch c {
	case CodecRaw:
		return "raw"
	case CodecZstd:
		return "zstd"
	}
	return fmt.Sprintf("codec(%d)", uint8(c))
}

// codecs holds the encoder and decoder state of one store. klauspost's
// Encoder.EncodeAll and Decoder.DecodeAll are safe for concurrent use.
type codecs struct {
	zenc *zstd.Encoder
	zdec *zstd.Decoder
}

func newCodecs() (*codecs, error) {
	enc, err := zstd.NewWriter(nil,
		zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderConcurrency(1),
		zstd.WithZeroFrames(true),
		zstd.WithEncoderCRC(false)) // the object header carries a CRC of the payload
	if err != nil {
		return nil, fmt.Errorf("zstd encoder: %w", err)
	}
	dec, err := zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(0),
		zstd.WithDecoderMaxMemory(1<<30))
	if err != nil {
		return nil, fmt.Errorf("zstd decoder: %w", err)
	}
	return &codecs{zenc: enc, zdec: dec}, nil
}

func (c *codecs) close() {
	c.zenc.Close()
	c.zdec.Close()
}

// minSaving is the fraction of a chunk an encoding must save to be kept; below
// it the chunk is stored raw, which decodes at memcpy speed.
const minSaving = 1.0 / 32

// encode picks the codec for raw and returns it with the payload. The payload may
// alias raw (CodecRaw).
func (c *codecs) encode(raw []byte) (Codec, []byte) {
	if len(raw) == 0 {
		return CodecRaw, raw
	}
	z := c.zenc.EncodeAll(raw, make([]byte, 0, len(raw)))
	if float64(len(z)) <= float64(len(raw))*(1-minSaving) {
		return CodecZstd, z
	}
	return CodecRaw, raw
}

// decode decodes payload into a new buffer of exactly rawLen bytes.
func (c *codecs) decode(codec Codec, payload []byte, rawLen int) ([]byte, error) {
	switch codec {
	case CodecRaw:
		if len(payload) != rawLen {
			return nil, fmt.Errorf("raw payload is %d bytes, header says %d", len(payload), rawLen)
		}
		out := make([]byte, rawLen)
		copy(out, payload)
		return out, nil
	case CodecZstd:
		out, err := c.zdec.DecodeAll(payload, make([]byte, 0, rawLen))
		if err != nil {
			return nil, fmt.Errorf("zstd: %w", err)
		}
		if len(out) != rawLen {
			return nil, fmt.Errorf("zstd payload decoded to %d bytes, header says %d", len(out), rawLen)
		}
		return out, nil
	}
	return nil, fmt.Errorf("unknown codec %d", uint8(codec))
}
