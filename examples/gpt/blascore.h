/* blascore.h - OpenBLAS's kernels on CPUs newer than the OpenBLAS build knows. */
#ifndef GPT_BLASCORE_H
#define GPT_BLASCORE_H

/* Called first thing in main, before MPI_Init. Where OPENBLAS_CORETYPE is unset and OpenBLAS fell back to
 * its SSE3 "Prescott" kernels on a CPU with AVX2 or AVX512, sets OPENBLAS_CORETYPE to the kernels that CPU
 * runs and executes the program again (argv unchanged); returns only where nothing is to be done or the
 * re-execution failed (the program then runs on the slow kernels). */
void gpt_blas_fix_core(char **argv);

/* the kernels OpenBLAS runs, for the start-up lines */
const char *gpt_blas_core(void);

#endif /* GPT_BLASCORE_H */
