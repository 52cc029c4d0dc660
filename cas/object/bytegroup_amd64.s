//go:build amd64 && !purego

#include "textflag.h"

// Byte-group kernels for 16-bit elements rotated left by one bit (see
// bytegroup_split.go). len(p0) must be a multiple of 16, p1 as long, and raw or
// out twice as long.

// func split2SSE2(raw, p0, p1 []byte)
TEXT ·split2SSE2(SB), NOSPLIT, $0-72
	MOVQ  raw_base+0(FP), SI
	MOVQ  p0_base+24(FP), DI
	MOVQ  p0_len+32(FP), CX
	MOVQ  p1_base+48(FP), DX
	SHRQ  $4, CX
	JZ    sdone
	MOVOU bgLow16<>(SB), X8
	MOVOU bgFE<>(SB), X6
	MOVOU bg01<>(SB), X7

sloop:
	MOVOU    (SI), X0
	MOVOU    16(SI), X1
	MOVO     X0, X2
	MOVO     X1, X3
	PAND     X8, X0
	PAND     X8, X1
	PACKUSWB X1, X0       // L: low bytes of 16 elements
	PSRLW    $8, X2
	PSRLW    $8, X3
	PACKUSWB X3, X2       // H: high bytes
	MOVO     X0, X4       // L' = L<<1 | H>>7 (bytewise)
	PSLLW    $1, X4
	PAND     X6, X4
	MOVO     X2, X5
	PSRLW    $7, X5
	PAND     X7, X5
	POR      X5, X4
	MOVO     X2, X5       // H' = H<<1 | L>>7
	PSLLW    $1, X5
	PAND     X6, X5
	PSRLW    $7, X0
	PAND     X7, X0
	POR      X0, X5
	MOVOU    X4, (DI)
	MOVOU    X5, (DX)
	ADDQ     $32, SI
	ADDQ     $16, DI
	ADDQ     $16, DX
	DECQ     CX
	JNZ      sloop

sdone:
	RET

// func merge2SSE2(out, p0, p1 []byte)
TEXT ·merge2SSE2(SB), NOSPLIT, $0-72
	MOVQ  out_base+0(FP), DI
	MOVQ  p0_base+24(FP), SI
	MOVQ  p0_len+32(FP), CX
	MOVQ  p1_base+48(FP), DX
	SHRQ  $4, CX
	JZ    mdone
	MOVOU bg7F<>(SB), X6
	MOVOU bg01<>(SB), X7

mloop:
	MOVOU     (SI), X0    // L'
	MOVOU     (DX), X1    // H'
	MOVO      X0, X2      // L = L'>>1 | H'<<7 (bytewise)
	PSRLW     $1, X2
	PAND      X6, X2
	MOVO      X1, X3
	PAND      X7, X3
	PSLLW     $7, X3
	POR       X3, X2
	MOVO      X1, X4      // H = H'>>1 | L'<<7
	PSRLW     $1, X4
	PAND      X6, X4
	PAND      X7, X0
	PSLLW     $7, X0
	POR       X0, X4
	MOVO      X2, X5
	PUNPCKLBW X4, X2      // elements 0-7
	PUNPCKHBW X4, X5      // elements 8-15
	MOVOU     X2, (DI)
	MOVOU     X5, 16(DI)
	ADDQ      $16, SI
	ADDQ      $16, DX
	ADDQ      $32, DI
	DECQ      CX
	JNZ       mloop

mdone:
	RET

// func merge2PlainSSE2(out, p0, p1 []byte)
// merge2SSE2 without the rotation.
TEXT ·merge2PlainSSE2(SB), NOSPLIT, $0-72
	MOVQ out_base+0(FP), DI
	MOVQ p0_base+24(FP), SI
	MOVQ p0_len+32(FP), CX
	MOVQ p1_base+48(FP), DX
	SHRQ $4, CX
	JZ   pdone

ploop:
	MOVOU     (SI), X0
	MOVOU     (DX), X1
	MOVO      X0, X2
	PUNPCKLBW X1, X0 // elements 0-7
	PUNPCKHBW X1, X2 // elements 8-15
	MOVOU     X0, (DI)
	MOVOU     X2, 16(DI)
	ADDQ      $16, SI
	ADDQ      $16, DX
	ADDQ      $32, DI
	DECQ      CX
	JNZ       ploop

pdone:
	RET

// func merge4SSE2(out, p0, p1, p2, p3 []byte, rot bool)
// out holds the 32-bit elements whose byte j is in pj, rotated right by one
// bit when rot (merge4Go). len(p0) a multiple of 16, the other planes as
// long, out four times as long.
TEXT ·merge4SSE2(SB), NOSPLIT, $0-121
	MOVQ out_base+0(FP), DI
	MOVQ p0_base+24(FP), SI
	MOVQ p0_len+32(FP), CX
	MOVQ p1_base+48(FP), R8
	MOVQ p2_base+72(FP), R9
	MOVQ p3_base+96(FP), R10
	MOVB rot+120(FP), AX
	SHRQ $4, CX
	JZ   m4done

m4loop:
	MOVOU     (SI), X0
	MOVOU     (R8), X1
	MOVOU     (R9), X2
	MOVOU     (R10), X3
	MOVO      X0, X4
	PUNPCKLBW X1, X0 // bytes 0,1 of elements 0-7
	PUNPCKHBW X1, X4 // of elements 8-15
	MOVO      X2, X5
	PUNPCKLBW X3, X2 // bytes 2,3 of elements 0-7
	PUNPCKHBW X3, X5 // of elements 8-15
	MOVO      X0, X1
	PUNPCKLWL X2, X0 // elements 0-3
	PUNPCKHWL X2, X1 // 4-7
	MOVO      X4, X3
	PUNPCKLWL X5, X4 // 8-11
	PUNPCKHWL X5, X3 // 12-15
	TESTB     AL, AL
	JZ        m4store
	MOVO      X0, X2 // rotate each element right by one bit
	PSRLL     $1, X0
	PSLLL     $31, X2
	POR       X2, X0
	MOVO      X1, X2
	PSRLL     $1, X1
	PSLLL     $31, X2
	POR       X2, X1
	MOVO      X4, X2
	PSRLL     $1, X4
	PSLLL     $31, X2
	POR       X2, X4
	MOVO      X3, X2
	PSRLL     $1, X3
	PSLLL     $31, X2
	POR       X2, X3

m4store:
	MOVOU X0, (DI)
	MOVOU X1, 16(DI)
	MOVOU X4, 32(DI)
	MOVOU X3, 48(DI)
	ADDQ  $16, SI
	ADDQ  $16, R8
	ADDQ  $16, R9
	ADDQ  $16, R10
	ADDQ  $64, DI
	DECQ  CX
	JNZ   m4loop

m4done:
	RET

DATA bg7F<>+0(SB)/8, $0x7f7f7f7f7f7f7f7f
DATA bg7F<>+8(SB)/8, $0x7f7f7f7f7f7f7f7f
GLOBL bg7F<>(SB), RODATA|NOPTR, $16
DATA bgFE<>+0(SB)/8, $0xfefefefefefefefe
DATA bgFE<>+8(SB)/8, $0xfefefefefefefefe
GLOBL bgFE<>(SB), RODATA|NOPTR, $16
DATA bg01<>+0(SB)/8, $0x0101010101010101
DATA bg01<>+8(SB)/8, $0x0101010101010101
GLOBL bg01<>(SB), RODATA|NOPTR, $16
DATA bgLow16<>+0(SB)/8, $0x00ff00ff00ff00ff
DATA bgLow16<>+8(SB)/8, $0x00ff00ff00ff00ff
GLOBL bgLow16<>(SB), RODATA|NOPTR, $16
