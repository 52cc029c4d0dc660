//go:build amd64 && !purego

#include "textflag.h"

// Kernels of undoing a delta (delta_amd64.go, delta_kernels.go).

// func gather2Asm(dst, perm, base []byte, of *[256]uint8, off *[256]uint32) bool
// For each 16-bit element i of dst: k = of[base[i]>>7 & 0xff]; p = off[k];
// p must be below len(perm)/2 (else return false); off[k]++; dst[i] = perm[p].
// base is at least as long as dst. Four elements an iteration: one load of
// base and one store to dst.
TEXT ·gather2Asm(SB), NOSPLIT, $0-89
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ perm_base+24(FP), R8
	MOVQ perm_len+32(FP), R11
	MOVQ base_base+48(FP), SI
	MOVQ of+72(FP), R9
	MOVQ off+80(FP), R10
	SHRQ $1, CX
	SHRQ $1, R11
	MOVQ CX, R12
	ANDQ $3, R12             // elements after the quads
	SHRQ $2, CX
	JZ   g2one

g2quad:
	MOVQ    (SI), AX
	MOVQ    AX, BX
	SHRQ    $7, BX
	MOVBLZX BL, BX
	MOVBLZX (R9)(BX*1), BX
	MOVL    (R10)(BX*4), DX
	CMPQ    DX, R11
	JAE     g2bad
	INCL    (R10)(BX*4)
	MOVWQZX (R8)(DX*2), R13
	MOVQ    AX, BX
	SHRQ    $23, BX
	MOVBLZX BL, BX
	MOVBLZX (R9)(BX*1), BX
	MOVL    (R10)(BX*4), DX
	CMPQ    DX, R11
	JAE     g2bad
	INCL    (R10)(BX*4)
	MOVWQZX (R8)(DX*2), DX
	SHLQ    $16, DX
	ORQ     DX, R13
	MOVQ    AX, BX
	SHRQ    $39, BX
	MOVBLZX BL, BX
	MOVBLZX (R9)(BX*1), BX
	MOVL    (R10)(BX*4), DX
	CMPQ    DX, R11
	JAE     g2bad
	INCL    (R10)(BX*4)
	MOVWQZX (R8)(DX*2), DX
	SHLQ    $32, DX
	ORQ     DX, R13
	SHRQ    $55, AX
	MOVBLZX AL, AX
	MOVBLZX (R9)(AX*1), BX
	MOVL    (R10)(BX*4), DX
	CMPQ    DX, R11
	JAE     g2bad
	INCL    (R10)(BX*4)
	MOVWQZX (R8)(DX*2), DX
	SHLQ    $48, DX
	ORQ     DX, R13
	MOVQ    R13, (DI)
	ADDQ    $8, SI
	ADDQ    $8, DI
	DECQ    CX
	JNZ     g2quad

g2one:
	TESTQ R12, R12
	JZ    g2ok

g2loop:
	MOVWLZX (SI), AX
	SHRL    $7, AX
	MOVBLZX AL, AX
	MOVBLZX (R9)(AX*1), AX
	MOVL    (R10)(AX*4), DX
	CMPQ    DX, R11
	JAE     g2bad
	LEAL    1(DX), BX
	MOVL    BX, (R10)(AX*4)
	MOVW    (R8)(DX*2), BX
	MOVW    BX, (DI)
	ADDQ    $2, SI
	ADDQ    $2, DI
	DECQ    R12
	JNZ     g2loop

g2ok:
	MOVB $1, ret+88(FP)
	RET

g2bad:
	MOVB $0, ret+88(FP)
	RET

// func gather4Asm(dst, perm, base []byte, of *[256]uint8, off *[256]uint32) bool
// gather2Asm for 32-bit elements, classed by base[i]>>23 & 0xff; two
// elements an iteration.
TEXT ·gather4Asm(SB), NOSPLIT, $0-89
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ perm_base+24(FP), R8
	MOVQ perm_len+32(FP), R11
	MOVQ base_base+48(FP), SI
	MOVQ of+72(FP), R9
	MOVQ off+80(FP), R10
	SHRQ $2, CX
	SHRQ $2, R11
	MOVQ CX, R12
	ANDQ $1, R12             // an element after the pairs
	SHRQ $1, CX
	JZ   g4one

g4pair:
	MOVQ    (SI), AX
	MOVQ    AX, BX
	SHRQ    $23, BX
	MOVBLZX BL, BX
	MOVBLZX (R9)(BX*1), BX
	MOVL    (R10)(BX*4), DX
	CMPQ    DX, R11
	JAE     g4bad
	INCL    (R10)(BX*4)
	MOVL    (R8)(DX*4), R13
	SHRQ    $55, AX
	MOVBLZX AL, AX
	MOVBLZX (R9)(AX*1), BX
	MOVL    (R10)(BX*4), DX
	CMPQ    DX, R11
	JAE     g4bad
	INCL    (R10)(BX*4)
	MOVL    (R8)(DX*4), DX
	SHLQ    $32, DX
	ORQ     DX, R13
	MOVQ    R13, (DI)
	ADDQ    $8, SI
	ADDQ    $8, DI
	DECQ    CX
	JNZ     g4pair

g4one:
	TESTQ R12, R12
	JZ    g4ok
	MOVL    (SI), AX
	SHRL    $23, AX
	MOVBLZX AL, AX
	MOVBLZX (R9)(AX*1), AX
	MOVL    (R10)(AX*4), DX
	CMPQ    DX, R11
	JAE     g4bad
	INCL    (R10)(AX*4)
	MOVL    (R8)(DX*4), BX
	MOVL    BX, (DI)

g4ok:
	MOVB $1, ret+88(FP)
	RET

g4bad:
	MOVB $0, ret+88(FP)
	RET

// func undoSub16SSE2(out, z, base []byte)
// out[i] = unmono16(mono16(base[i]) + unzigzag(z[i])), 16-bit elements;
// len(out) a multiple of 16, z and base as long; out may be z.
TEXT ·undoSub16SSE2(SB), NOSPLIT, $0-72
	MOVQ    out_base+0(FP), DI
	MOVQ    out_len+8(FP), CX
	MOVQ    z_base+24(FP), SI
	MOVQ    base_base+48(FP), DX
	SHRQ    $4, CX
	JZ      u16done
	MOVOU   dlH16<>(SB), X7
	MOVOU   dlOne16<>(SB), X6
	PCMPEQW X5, X5
	PXOR    X4, X4

u16loop:
	MOVOU (SI), X0
	MOVOU (DX), X1
	MOVO  X0, X2
	PSRLW $1, X0
	PAND  X6, X2
	MOVO  X4, X3
	PSUBW X2, X3
	PXOR  X3, X0  // d = z>>1 ^ -(z&1)
	MOVO  X1, X2
	PSRAW $15, X2
	POR   X7, X2
	PXOR  X2, X1  // mono16(b) = b ^ (b>>15 (arithmetic) | 0x8000)
	PADDW X0, X1  // v
	MOVO  X1, X2
	PSRAW $15, X2
	PXOR  X5, X2
	POR   X7, X2
	PXOR  X2, X1  // unmono16(v) = v ^ (^v>>15 (arithmetic) | 0x8000)
	MOVOU X1, (DI)
	ADDQ  $16, SI
	ADDQ  $16, DX
	ADDQ  $16, DI
	DECQ  CX
	JNZ   u16loop

u16done:
	RET

// func undoSub32SSE2(out, z, base []byte)
// undoSub16SSE2 for 32-bit elements.
TEXT ·undoSub32SSE2(SB), NOSPLIT, $0-72
	MOVQ    out_base+0(FP), DI
	MOVQ    out_len+8(FP), CX
	MOVQ    z_base+24(FP), SI
	MOVQ    base_base+48(FP), DX
	SHRQ    $4, CX
	JZ      u32done
	MOVOU   dlH32<>(SB), X7
	MOVOU   dlOne32<>(SB), X6
	PCMPEQL X5, X5
	PXOR    X4, X4

u32loop:
	MOVOU (SI), X0
	MOVOU (DX), X1
	MOVO  X0, X2
	PSRLL $1, X0
	PAND  X6, X2
	MOVO  X4, X3
	PSUBL X2, X3
	PXOR  X3, X0
	MOVO  X1, X2
	PSRAL $31, X2
	POR   X7, X2
	PXOR  X2, X1
	PADDL X0, X1
	MOVO  X1, X2
	PSRAL $31, X2
	PXOR  X5, X2
	POR   X7, X2
	PXOR  X2, X1
	MOVOU X1, (DI)
	ADDQ  $16, SI
	ADDQ  $16, DX
	ADDQ  $16, DI
	DECQ  CX
	JNZ   u32loop

u32done:
	RET

// func xorSSE2(dst, a, b []byte)
// dst[i] = a[i] ^ b[i]; len(dst) a multiple of 16, a and b as long; dst may
// be a.
TEXT ·xorSSE2(SB), NOSPLIT, $0-72
	MOVQ dst_base+0(FP), DI
	MOVQ dst_len+8(FP), CX
	MOVQ a_base+24(FP), SI
	MOVQ b_base+48(FP), DX
	SHRQ $4, CX
	JZ   xdone

xloop:
	MOVOU (SI), X0
	MOVOU (DX), X1
	PXOR  X1, X0
	MOVOU X0, (DI)
	ADDQ  $16, SI
	ADDQ  $16, DX
	ADDQ  $16, DI
	DECQ  CX
	JNZ   xloop

xdone:
	RET

DATA dlH16<>+0(SB)/8, $0x8000800080008000
DATA dlH16<>+8(SB)/8, $0x8000800080008000
GLOBL dlH16<>(SB), RODATA|NOPTR, $16

DATA dlOne16<>+0(SB)/8, $0x0001000100010001
DATA dlOne16<>+8(SB)/8, $0x0001000100010001
GLOBL dlOne16<>(SB), RODATA|NOPTR, $16

DATA dlH32<>+0(SB)/8, $0x8000000080000000
DATA dlH32<>+8(SB)/8, $0x8000000080000000
GLOBL dlH32<>(SB), RODATA|NOPTR, $16

DATA dlOne32<>+0(SB)/8, $0x0000000100000001
DATA dlOne32<>+8(SB)/8, $0x0000000100000001
GLOBL dlOne32<>(SB), RODATA|NOPTR, $16
