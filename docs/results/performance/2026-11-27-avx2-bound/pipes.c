// Throughput of single 256-bit integer instructions on this CPU: 10 independent chains each.
// The clock is taken as 3.66 GHz (measured on this VM with a chain of dependent adds).
#include <immintrin.h>
#include <stdio.h>
#include <time.h>
static double now(){struct timespec a;clock_gettime(CLOCK_MONOTONIC,&a);return a.tv_sec+a.tv_nsec*1e-9;}
#define BODY(OP) a0=OP(a0,b);a1=OP(a1,b);a2=OP(a2,b);a3=OP(a3,b);a4=OP(a4,b);a5=OP(a5,b);a6=OP(a6,b);a7=OP(a7,b);a8=OP(a8,b);a9=OP(a9,b);
#define RUN(NAME,OP) { double t=now(); for(long i=0;i<n;i++){ BODY(OP) __asm__ volatile("" : "+x"(a0),"+x"(a1),"+x"(a2),"+x"(a3),"+x"(a4),"+x"(a5),"+x"(a6),"+x"(a7),"+x"(a8),"+x"(a9)); } double s=now()-t; printf("%s: %.2f per cycle\n", NAME, 10.0*n/(s*3.66e9)); }
static inline __m256i dp(__m256i a, __m256i b){ return _mm256_dpbusd_epi32(a,b,b); }
int main(){
  __m256i a0=_mm256_set1_epi8(1),a1=a0,a2=a0,a3=a0,a4=a0,a5=a0,a6=a0,a7=a0,a8=a0,a9=a0;
  __m256i b=_mm256_set1_epi8(3);
  long n=100000000;
  RUN("maddubs", _mm256_maddubs_epi16)
  RUN("madd", _mm256_madd_epi16)
  RUN("paddw", _mm256_add_epi16)
  RUN("vpdpbusd", dp)
  
  return 0;
}
