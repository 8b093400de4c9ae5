// The steady-state mix of the AVX2 Q4 tile (per 32 MACs: one maddubs on 8 rows, one add, one
// activation operand) with the operand from a 4-byte broadcast, a 32-byte load or a 16-byte
// broadcast; maddubs per cycle at 3.66 GHz.
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
#include <stdint.h>
static double now(){struct timespec a;clock_gettime(CLOCK_MONOTONIC,&a);return a.tv_sec+a.tv_nsec*1e-9;}
uint8_t buf[8192] __attribute__((aligned(64)));
#define LOOP(NAME, LD) { __m256i s0=_mm256_setzero_si256(),s1=s0,s2=s0,s3=s0,s4=s0,s5=s0,s6=s0,s7=s0; double t=now(); \
  for(long i=0;i<n;i++){ const uint8_t *p = buf + ((i & 15) << 8); \
    s0=_mm256_add_epi16(s0,_mm256_maddubs_epi16(lo,LD(p,0))); s1=_mm256_add_epi16(s1,_mm256_maddubs_epi16(hi,LD(p,1))); \
    s2=_mm256_add_epi16(s2,_mm256_maddubs_epi16(lo,LD(p,2))); s3=_mm256_add_epi16(s3,_mm256_maddubs_epi16(hi,LD(p,3))); \
    s4=_mm256_add_epi16(s4,_mm256_maddubs_epi16(lo,LD(p,4))); s5=_mm256_add_epi16(s5,_mm256_maddubs_epi16(hi,LD(p,5))); \
    s6=_mm256_add_epi16(s6,_mm256_maddubs_epi16(lo,LD(p,6))); s7=_mm256_add_epi16(s7,_mm256_maddubs_epi16(hi,LD(p,7))); \
    __asm__ volatile("" : "+x"(lo),"+x"(hi)); } \
  double s=now()-t; printf("%s: %.2f maddubs/cycle\n", NAME, 8.0*n/(s*3.66e9)); \
  __asm__ volatile("" :: "x"(s0),"x"(s1),"x"(s2),"x"(s3),"x"(s4),"x"(s5),"x"(s6),"x"(s7)); }
#define BC(p,j) _mm256_set1_epi32(*(const int32_t*)((p)+4*(j)))
#define LDU(p,j) _mm256_load_si256((const __m256i*)((p)+32*(j)))
#define B128(p,j) _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i*)((p)+16*(j))))
int main(){
  for(int i=0;i<8192;i++) buf[i]=i*7;
  __m256i lo=_mm256_set1_epi8(5), hi=_mm256_set1_epi8(7);
  long n=100000000;
  for (int r=0;r<2;r++){
  LOOP("vpbroadcastd m32", BC)
  LOOP("vmovdqa m256", LDU)
  LOOP("vbroadcasti128 m128", B128)
  }
  return 0;
}
