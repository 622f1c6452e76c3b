/*
 * Test-harness stand-in for bcryptprimitives.dll, for running reshard's
 * Windows tests under Wine 8, which lacks that DLL. Rust's standard library
 * imports ProcessPrng from it (for HashMap seeds and the like); without the
 * DLL no Rust Windows program starts under Wine 8.
 *
 * NEVER SHIPPED: scripts/windows-test.sh builds it into a private Wine prefix
 * used only by the test run. Real Windows (10 and later) has the real DLL.
 *
 * ProcessPrng is documented to always return TRUE; it is implemented over
 * RtlGenRandom (advapi32!SystemFunction036), which Wine provides. RtlGenRandom
 * takes a ULONG length, so larger requests go in pieces.
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len)
{
    while (len > 0) {
        ULONG chunk = len > 0x40000000 ? 0x40000000 : (ULONG)len;
        if (!SystemFunction036(data, chunk))
            return FALSE;
        data += chunk;
        len -= chunk;
    }
    return TRUE;
}
