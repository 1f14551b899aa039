// What freeing "device" pages costs the host backend: 1 GiB populated and
// written, then copied out to a host buffer and freed in 64 MiB chunks on
// two threads (as a colo-mem pause does), against a memcpy of 1 GiB.
//   mode 0: a memfd mapping, pages freed by MADV_REMOVE (the old backend)
//   mode 1: anonymous private memory, MADV_DONTNEED, 4 KiB pages
//   mode 2: mode 1 with MADV_HUGEPAGE (the backend since the 21st session)
// Usage: gcc -O2 -pthread -o /tmp/page_release bench/cpu/page_release.c
//        for m in 0 1 2; do /tmp/page_release $m; done
// The first of the four repetitions pays for the machine's first touch of
// its memory (on a VM, the hypervisor's too); read the later ones.
#define _GNU_SOURCE
#include <sys/mman.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#define SZ (1ul<<30)
#define CH (64ul<<20)
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
char *dev,*host; int mode;
void *work(void*a){ long t=(long)a; for(size_t o=t*SZ/2;o<(t+1)*SZ/2;o+=CH){ memcpy(host+o,dev+o,CH); if(mode==0) madvise(dev+o,CH,MADV_REMOVE); else madvise(dev+o,CH,MADV_DONTNEED);} return 0;}
int main(int argc,char**argv){
  mode=atoi(argv[1]);
  host=aligned_alloc(1<<21,SZ); memset(host,1,SZ);
  char *ref=aligned_alloc(1<<21,SZ); memset(ref,2,SZ);
  double t=now(); memcpy(host,ref,SZ); double mc=now()-t; t=now(); memcpy(host,ref,SZ); mc=now()-t<mc?now()-t:mc;
  for(int rep=0;rep<4;rep++){
  if(mode==0){ int fd=memfd_create("x",0); ftruncate(fd,SZ); dev=mmap(0,SZ,PROT_READ|PROT_WRITE,MAP_SHARED,fd,0); close(fd);}
  else { char*r=mmap(0,SZ+(2<<20),PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); dev=(char*)(((unsigned long)r+(2<<20)-1)&~((2ul<<20)-1)); if(mode==2) madvise(dev,SZ,MADV_HUGEPAGE);}
  t=now(); madvise(dev,SZ,MADV_POPULATE_WRITE); double pop=now()-t; memset(dev,3,SZ);
  t=now(); pthread_t th[2]; for(long i=0;i<2;i++) pthread_create(&th[i],0,work,(void*)i); for(int i=0;i<2;i++) pthread_join(th[i],0); double pa=now()-t;
  printf("mode %d: memcpy %.1f GiB/s, populate %.1f ms, pause %.1f ms = %.2f GiB/s = %.2fx memcpy\n",mode,1/mc,pop*1e3,pa*1e3,1/pa,mc/pa);
  munmap(dev,SZ);}
}
