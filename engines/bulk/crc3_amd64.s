#include "textflag.h"

// func crc3SSE42(a, b, c *byte, n int) (ca, cb, cc uint32)
//
// The CRC32Cs of n bytes at a, b and c, interleaved: the three chains of
// CRC32 instructions run in parallel (latency 3, throughput 1).
TEXT ·crc3SSE42(SB), NOSPLIT, $0-44
	MOVQ a+0(FP), R8
	MOVQ b+8(FP), R9
	MOVQ c+16(FP), R10
	MOVQ n+24(FP), R11
	MOVL $0xffffffff, AX
	MOVL AX, CX
	MOVL AX, DX

loop8:
	CMPQ R11, $8
	JL   tail
	CRC32Q (R8), AX
	CRC32Q (R9), CX
	CRC32Q (R10), DX
	ADDQ $8, R8
	ADDQ $8, R9
	ADDQ $8, R10
	SUBQ $8, R11
	JMP  loop8

tail:
	TESTQ R11, R11
	JZ    done
	CRC32B (R8), AX
	CRC32B (R9), CX
	CRC32B (R10), DX
	INCQ R8
	INCQ R9
	INCQ R10
	DECQ R11
	JMP  tail

done:
	NOTL AX
	NOTL CX
	NOTL DX
	MOVL AX, ca+32(FP)
	MOVL CX, cb+36(FP)
	MOVL DX, cc+40(FP)
	RET

// func cpuidECX1() uint32
TEXT ·cpuidECX1(SB), NOSPLIT, $0-4
	MOVL $1, AX
	XORL CX, CX
	CPUID
	MOVL CX, ret+0(FP)
	RET
