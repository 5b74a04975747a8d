/* params_cmp.c - compares two raw fp32 parameter dumps (zs-train-mlp --dump): prints the relative L2
 * difference ||a-b||/||b|| and the largest element-wise relative difference, and exits 1 when the chosen
 * one is above the tolerance given. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *load(const char *path, long *n)
{
    FILE *f = fopen(path, "rb");
    float *d;

    if (!f) {
        perror(path);
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    *n = ftell(f) / 4;
    rewind(f);
    d = malloc((size_t)*n * 4 + 4);
    if (d && fread(d, 4, (size_t)*n, f) != (size_t)*n) {
        free(d);
        d = NULL;
    }
    fclose(f);
    return d;
}

int main(int argc, char **argv)
{
    long na, nb;
    float *a, *b;
    double worst = 0.0, tol, scale = 0.0, d2 = 0.0, b2 = 0.0;
    int use_l2;

    if (argc != 5 || (strcmp(argv[4], "l2") && strcmp(argv[4], "max"))) {
        fprintf(stderr, "usage: zs-params-cmp A.bin B.bin TOLERANCE l2|max\n");
        return 2;
    }
    use_l2 = !strcmp(argv[4], "l2");
    tol = atof(argv[3]);
    a = load(argv[1], &na);
    b = load(argv[2], &nb);
    if (!a || !b || na != nb) {
        fprintf(stderr, "cannot compare %s and %s (sizes %ld and %ld)\n", argv[1], argv[2], na, nb);
        return 2;
    }
    for (long i = 0; i < na; i++)
        scale = fmax(scale, fabs((double)b[i]));
    /* relative to each element, with the largest parameter as the floor for elements near zero */
    for (long i = 0; i < na; i++) {
        double d = fabs((double)a[i] - (double)b[i]) / fmax(fabs((double)b[i]), 1e-3 * scale);
        worst = fmax(worst, d);
        d2 += ((double)a[i] - (double)b[i]) * ((double)a[i] - (double)b[i]);
        b2 += (double)b[i] * (double)b[i];
    }
    double l2 = b2 > 0 ? sqrt(d2 / b2) : sqrt(d2);
    printf("relative L2 difference %.3g, max element relative difference %.3g over %ld parameters "
           "(tolerance %g on %s)\n", l2, worst, na, tol, use_l2 ? "L2" : "max");
    free(a);
    free(b);
    return (use_l2 ? l2 : worst) <= tol ? 0 : 1;
}
