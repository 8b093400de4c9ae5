#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#define N (1UL<<30)
static char *buf; static int nt;
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void *rd(void *a){long i=(long)a; size_t per=N/nt; __m512i s=_mm512_setzero_si512();
 for(size_t o=i*per;o<(i+1)*per;o+=256){ s=_mm512_add_epi64(s,_mm512_load_si512(buf+o)); s=_mm512_add_epi64(s,_mm512_load_si512(buf+o+64)); s=_mm512_add_epi64(s,_mm512_load_si512(buf+o+128)); s=_mm512_add_epi64(s,_mm512_load_si512(buf+o+192));}
 static volatile long sink; sink=_mm512_reduce_add_epi64(s); return 0;}
int main(int c,char**v){nt=atoi(v[1]); int huge=atoi(v[2]);
 buf=aligned_alloc(1<<21,N); if(huge) madvise(buf,N,MADV_HUGEPAGE); memset(buf,1,N);
 for(int r=0;r<6;r++){double t=now(); pthread_t th[8]; for(long i=0;i<nt;i++)pthread_create(&th[i],0,rd,(void*)i); for(int i=0;i<nt;i++)pthread_join(th[i],0); printf("%.1f ",N/(now()-t)/1e9);} printf("GB/s threads=%d huge=%d\n",nt,huge);}
