/*
 * cli: the subcommands of the tokenmill program. Each returns the process exit status
 * (0 ok, 1 runtime failure, 2 usage error) and prints its own errors to stderr; none calls
 * exit(), so they can also be driven from tests.
 */
#ifndef TM_CMD_H
#define TM_CMD_H

int cmd_run(int argc, char **argv);       /* generate text from a prompt */
int cmd_tokenize(int argc, char **argv);  /* print token ids as JSON */
int cmd_convert(int argc, char **argv);   /* llama2.c checkpoint -> GGUF */
int cmd_mkmodel(int argc, char **argv);   /* random-weight GGUF of a real shape and vocab */
int cmd_eval(int argc, char **argv);      /* per-position top log-probs + greedy, as JSON (tests) */
int cmd_bench(int argc, char **argv);     /* pp/tg timings as JSON (bench/engine); curves; profile */
int cmd_template(int argc, char **argv);  /* chat template rendering as token ids (tests) */
int cmd_grammar(int argc, char **argv);   /* structured output: print / check / sample / bench (tests, tools) */

int cmd_serve(int argc, char **argv);     /* the HTTP server (OpenAI / Anthropic APIs) */
int cmd_gateway(int argc, char **argv);   /* the front of a disaggregated cluster (cluster/gateway.h) */
int cmd_store(int argc, char **argv);     /* block store maintenance: stat|ls|gc|fsck SPEC */
int cmd_worker(int argc, char **argv);    /* a prefill/decode/mixed worker of the cluster (cluster/worker.h) */
int cmd_expert(int argc, char **argv);    /* a member of an expert-parallel group (cluster/ep.h) */

#endif
