//! The prompts-eval suite (store and service), run against SQLite and PostgreSQL alike.

use brainstorm_common::on_both_engines;
use brainstorm_common::store::Database;
use brainstorm_prompts_eval::PromptsEvalServiceImpl;
use brainstorm_proto::ErrorKind;
use brainstorm_proto::prompts::*;

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn create(tenant_id: &str, id: &str, template: &str) -> CreatePromptRequest {
    CreatePromptRequest {
        tenant_id: tenant_id.into(),
        id: id.into(),
        template: template.into(),
        variables_json: r#"{"tone": "kind"}"#.into(),
        environment: String::new(),
        change_note: "first".into(),
    }
}

fn reference(tenant_id: &str, id: &str) -> PromptRef {
    PromptRef { tenant_id: tenant_id.into(), prompt_id: id.into() }
}

async fn versions_environments_and_archiving(database: Database) -> TestResult {
    let service = PromptsEvalServiceImpl::new(database);
    let created = service.create_prompt(create("t1", "greet", "Hi {{name}}, be {{tone}}")).await?;
    assert_eq!((created.latest_version, created.dev_version, created.prod_version), (1, 1, 0));
    assert_eq!(service.create_prompt(create("t1", "greet", "x")).await.err().map(|error| error.kind), Some(ErrorKind::Conflict));
    service.create_prompt(create("t2", "greet", "other tenant")).await?;
    let update = UpdatePromptRequest {
        tenant_id: "t1".into(),
        prompt_id: "greet".into(),
        template: Some("Hello {{name}}".into()),
        variables_json: None,
        change_note: "v2".into(),
    };
    let updated = service.update_prompt(update.clone()).await?;
    assert_eq!(updated.versions.iter().map(|version| version.version).collect::<Vec<_>>(), [2, 1]);
    assert_eq!(updated.versions[0].variables_json, r#"{"tone":"kind"}"#, "variables carried over");
    let render = |version: u32, environment: &str| RenderRequest {
        tenant_id: "t1".into(),
        prompt_id: "greet".into(),
        variables_json: r#"{"name": "Ada"}"#.into(),
        version,
        environment: environment.into(),
        memory_key: String::new(),
    };
    assert_eq!(service.render_prompt(render(0, "")).await?.resolved_text, "Hello Ada");
    assert_eq!(service.render_prompt(render(1, "")).await?.resolved_text, "Hi Ada, be kind");
    assert_eq!(service.render_prompt(render(0, "dev")).await?.version, 1);
    assert_eq!(service.render_prompt(render(0, "prod")).await.err().map(|error| error.kind), Some(ErrorKind::NotFound));
    let promote = |version: u32, target: &str| PromoteRequest {
        tenant_id: "t1".into(),
        prompt_id: "greet".into(),
        version,
        target_environment: target.into(),
    };
    assert_eq!(service.promote_prompt(promote(2, "staging")).await.err().map(|error| error.reason), Some("promotion_out_of_order".into()));
    service.promote_prompt(promote(2, "dev")).await?;
    service.promote_prompt(promote(2, "staging")).await?;
    let promoted = service.promote_prompt(promote(2, "prod")).await?;
    assert_eq!((promoted.dev_version, promoted.staging_version, promoted.prod_version), (2, 2, 2));
    assert_eq!(service.promote_prompt(promote(9, "dev")).await.err().map(|error| error.reason), Some("version_not_found".into()));

    service.archive_prompt(reference("t1", "greet")).await?;
    let listed = service.list_prompts(ListPromptsRequest { tenant_id: "t1".into(), include_archived: false }).await?;
    assert!(listed.prompts.is_empty());
    let all = service.list_prompts(ListPromptsRequest { tenant_id: "t1".into(), include_archived: true }).await?;
    assert_eq!((all.prompts.len(), all.prompts[0].versions.len()), (1, 1), "lists carry the latest version only");
    assert_eq!(service.update_prompt(update).await.err().map(|error| error.reason), Some("prompt_archived".into()));
    Ok(())
}

async fn ab_tests_split_renders_and_report(database: Database) -> TestResult {
    let service = PromptsEvalServiceImpl::new(database);
    service.create_prompt(create("t1", "p", "A {{x}}")).await?;
    let update = UpdatePromptRequest {
        tenant_id: "t1".into(),
        prompt_id: "p".into(),
        template: Some("B {{x}}".into()),
        variables_json: None,
        change_note: String::new(),
    };
    service.update_prompt(update).await?;
    let start = AbTestRequest {
        tenant_id: "t1".into(),
        prompt_id: "p".into(),
        action: "start".into(),
        version_a: 1,
        version_b: 2,
        split_ratio_micros: 250_000,
    };
    assert_eq!(
        service.set_ab_test(AbTestRequest { version_b: 1, ..start.clone() }).await.err().map(|error| error.kind),
        Some(ErrorKind::InvalidArgument)
    );
    assert_eq!(
        service.set_ab_test(AbTestRequest { split_ratio_micros: 1_000_000, ..start.clone() }).await.err().map(|error| error.kind),
        Some(ErrorKind::InvalidArgument)
    );
    service.set_ab_test(start).await?;
    let render = RenderRequest { tenant_id: "t1".into(), prompt_id: "p".into(), ..RenderRequest::default() };
    let mut seen_a = 0;
    for _ in 0..200 {
        let rendered = service.render_prompt(render.clone()).await?;
        assert!(rendered.is_ab_test);
        seen_a += u32::from(rendered.version == 1);
    }
    assert!((20..=90).contains(&seen_a), "a quarter of 200 renders go to A, got {seen_a}");
    let test = service.get_ab_test(reference("t1", "p")).await?;
    assert_eq!(test.a.as_ref().map(|variant| variant.exposures), Some(u64::from(seen_a)));
    assert_eq!(test.b.as_ref().map(|variant| variant.exposures), Some(u64::from(200 - seen_a)));
    let stop = AbTestRequest { tenant_id: "t1".into(), prompt_id: "p".into(), action: "stop".into(), ..AbTestRequest::default() };
    assert!(!service.set_ab_test(stop.clone()).await?.active);
    assert_eq!(service.set_ab_test(stop).await.err().map(|error| error.reason), Some("ab_test_not_running".into()));
    assert!(!service.render_prompt(render).await?.is_ab_test);
    Ok(())
}

async fn evaluations_are_scored_and_kept(database: Database) -> TestResult {
    let service = PromptsEvalServiceImpl::new(database);
    service.create_prompt(create("t1", "p", "Capital of {{country}}?")).await?;
    let cases = vec![
        EvaluationCase { input_json: r#"{"country": "France"}"#.into(), expected_output: "Capital of  France?".into(), has_expected: true },
        EvaluationCase { input_json: r#"{"country": "Peru"}"#.into(), expected_output: "Lima".into(), has_expected: true },
    ];
    let prepare = PrepareEvaluationRequest {
        tenant_id: "t1".into(),
        prompt_id: "p".into(),
        cases: cases.clone(),
        ..PrepareEvaluationRequest::default()
    };
    let prepared = service.prepare_evaluation(prepare.clone()).await?;
    assert_eq!((prepared.version, prepared.scorer.as_str()), (1, "exact_match"));
    assert_eq!(prepared.rendered, ["Capital of France?", "Capital of Peru?"]);
    let judge_without_model = PrepareEvaluationRequest { scorer: "llm_judge".into(), ..prepare.clone() };
    assert!(service.prepare_evaluation(judge_without_model).await.is_err());
    let no_expected =
        PrepareEvaluationRequest { cases: vec![EvaluationCase { input_json: "{}".into(), ..EvaluationCase::default() }], ..prepare };
    assert_eq!(service.prepare_evaluation(no_expected).await.err().map(|error| error.reason), Some("invalid_test_cases".into()));

    let answers = prepared.rendered.iter().map(|rendered| CaseAnswer { actual: rendered.clone(), ..CaseAnswer::default() }).collect();
    let record = RecordEvaluationRequest {
        tenant_id: "t1".into(),
        prompt_id: "p".into(),
        version: 1,
        scorer: "exact_match".into(),
        model: String::new(),
        store: true,
        cases,
        rendered: prepared.rendered.clone(),
        answers,
    };
    let run = service.record_evaluation(record.clone()).await?;
    assert_eq!((run.pass_count, run.fail_count, run.avg_score_micros), (1, 1, 500_000));
    let failed_call = CaseAnswer { error: "503: provider down".into(), ..CaseAnswer::default() };
    let unstored = RecordEvaluationRequest { store: false, answers: vec![failed_call.clone(), failed_call], ..record };
    let unstored = service.record_evaluation(unstored).await?;
    assert_eq!((unstored.pass_count, unstored.avg_score_micros, unstored.results[0].error.as_str()), (0, 0, "503: provider down"));
    let runs = service.list_evaluations(reference("t1", "p")).await?.runs;
    assert_eq!(runs.len(), 1, "only the stored run");
    assert!(runs[0].results.is_empty(), "summaries only");
    let full = service.get_evaluation(EvaluationRef { tenant_id: "t1".into(), prompt_id: "p".into(), run_id: run.run_id.clone() }).await?;
    assert_eq!(full.results, run.results);
    let other = service.get_evaluation(EvaluationRef { tenant_id: "t2".into(), prompt_id: "p".into(), run_id: run.run_id }).await;
    assert_eq!(other.err().map(|error| error.kind), Some(ErrorKind::NotFound));
    let start = AbTestRequest {
        tenant_id: "t1".into(),
        prompt_id: "p".into(),
        action: "start".into(),
        version_a: 1,
        version_b: 2,
        split_ratio_micros: 500_000,
    };
    assert!(service.set_ab_test(start).await.is_err(), "version 2 does not exist");
    Ok(())
}

async fn datasets_hold_items_in_order_and_import_once(database: Database) -> TestResult {
    let service = PromptsEvalServiceImpl::new(database);
    let create = |name: &str| CreateDatasetRequest { tenant_id: "t1".into(), name: name.into(), description: "d".into() };
    let dataset = service.create_dataset(create("golden")).await?;
    assert_eq!(service.create_dataset(create(" golden ")).await.err().map(|error| error.reason), Some("dataset_exists".into()));
    service.create_dataset(CreateDatasetRequest { tenant_id: "t2".into(), ..create("golden") }).await?;
    let item =
        |input: &str, source: &str| DatasetItem { input_json: input.into(), source_request_id: source.into(), ..DatasetItem::default() };
    let add = |items: Vec<DatasetItem>| AddItemsRequest { tenant_id: "t1".into(), dataset_id: dataset.id.clone(), items };
    let added = service.add_items(add(vec![item(r#"{"n": 1}"#, ""), item(r#"{"n": 2}"#, "req_a"), item(r#"{"n": 3}"#, "req_a")])).await?;
    assert_eq!((added.items.len(), added.skipped), (2, 1), "one source request imported once, even within a call");
    let again = service.add_items(add(vec![item(r#"{"n": 4}"#, "req_a"), item(r#"{"n": 5}"#, "req_b")])).await?;
    assert_eq!((again.items.len(), again.skipped), (1, 1));
    assert_eq!(service.add_items(add(vec![item("[1]", "")])).await.err().map(|error| error.reason), Some("invalid_items".into()));
    assert_eq!(service.add_items(add(vec![item("{}", ""); 101])).await.err().map(|error| error.reason), Some("invalid_items".into()));
    let reference = DatasetRef { tenant_id: "t1".into(), dataset_id: dataset.id.clone() };
    let items = service.list_items(reference.clone()).await?.items;
    assert_eq!(items.iter().map(|item| item.input_json.as_str()).collect::<Vec<_>>(), [r#"{"n":1}"#, r#"{"n":2}"#, r#"{"n":5}"#]);
    assert_eq!(service.get_dataset(reference.clone()).await?.item_count, 3);
    let other_tenant = DatasetRef { tenant_id: "t2".into(), dataset_id: dataset.id.clone() };
    assert_eq!(service.list_items(other_tenant).await.err().map(|error| error.kind), Some(ErrorKind::NotFound));
    let renamed = service
        .update_dataset(UpdateDatasetRequest {
            tenant_id: "t1".into(),
            dataset_id: dataset.id.clone(),
            name: Some("silver".into()),
            description: None,
        })
        .await?;
    assert_eq!((renamed.name.as_str(), renamed.description.as_str()), ("silver", "d"));
    service.delete_item(ItemRef { tenant_id: "t1".into(), dataset_id: dataset.id.clone(), item_id: items[0].id.clone() }).await?;
    let missing =
        service.delete_item(ItemRef { tenant_id: "t1".into(), dataset_id: dataset.id.clone(), item_id: items[0].id.clone() }).await;
    assert_eq!(missing.err().map(|error| error.reason), Some("item_not_found".into()));
    assert_eq!(service.delete_dataset(reference.clone()).await?.item_count, 2);
    assert_eq!(service.get_dataset(reference).await.err().map(|error| error.kind), Some(ErrorKind::NotFound));
    assert_eq!(service.list_datasets(TenantRef { tenant_id: "t2".into() }).await?.datasets.len(), 1);
    Ok(())
}

async fn memory_evicts_protects_pins_and_audits(database: Database) -> TestResult {
    let service = PromptsEvalServiceImpl::new(database);
    let key = |memory_key: &str| Some(MemoryKey { tenant_id: "t1".into(), memory_key: memory_key.into() });
    let add = |fact: String, block: &str, pinned: bool| AddMemoryRequest {
        key: key(""),
        fact,
        block: block.into(),
        pinned,
        actor: "key-1".into(),
        reason: String::new(),
    };
    let pinned = service.add_memory(add("keep me".into(), "project", true)).await?;
    let mut first = None;
    for number in 0..49 {
        let added = service.add_memory(add(format!("fact {number}"), "project", false)).await?;
        first.get_or_insert(added.entry);
    }
    let overflow = service.add_memory(add("fact 49".into(), "project", false)).await?;
    assert_eq!(overflow.evicted.len(), 1);
    assert_eq!(Some(&overflow.evicted[0].id), first.as_ref().and_then(|entry| entry.as_ref()).map(|entry| &entry.id));
    let view = service.list_memory(MemoryQuery { key: key(""), block: "project".into(), include_archival: false }).await?;
    assert_eq!((view.entries.len(), view.total_core_entries, view.total_archival_entries), (50, 50, 1));
    assert!(view.entries.iter().any(|entry| Some(&entry.id) == pinned.entry.as_ref().map(|entry| &entry.id)));
    assert_eq!(service.add_memory(add(" ".into(), "project", false)).await.err().map(|error| error.reason), Some("invalid_fact".into()));
    // Another key of the tenant is another memory; the tenant id is the default key.
    assert_eq!(service.list_memory(MemoryQuery { key: key("agent-7"), ..MemoryQuery::default() }).await?.total_core_entries, 0);
    assert_eq!(service.list_memory(MemoryQuery { key: key("t1"), ..MemoryQuery::default() }).await?.total_core_entries, 50);

    for number in 0..50 {
        service.add_memory(add(format!("rule {number}"), "system", true)).await?;
    }
    let full = service.add_memory(add("one more".into(), "system", false)).await;
    assert_eq!(full.err().map(|error| error.reason), Some("memory_block_full".into()));

    let id = overflow.entry.as_ref().map(|entry| entry.id.clone()).unwrap_or_default();
    let update = UpdateMemoryRequest {
        key: key(""),
        id: id.clone(),
        fact: Some("fact 49, corrected".into()),
        pinned: Some(true),
        actor: "key-2".into(),
    };
    let updated = service.update_memory(update).await?;
    assert!(updated.pinned && updated.fact == "fact 49, corrected");
    service.delete_memory(MemoryEntryRef { key: key(""), id: id.clone(), actor: "key-2".into() }).await?;
    let trail = service.memory_audit(MemoryAuditQuery { key: key(""), limit: 3, ..MemoryAuditQuery::default() }).await?.entries;
    assert_eq!(trail.iter().map(|entry| entry.operation.as_str()).collect::<Vec<_>>(), ["delete", "pin", "replace"]);
    assert_eq!((trail[0].fact_after.as_str(), trail[2].fact_after.as_str(), trail[0].actor.as_str()), ("", "fact 49, corrected", "key-2"));
    let evictions =
        service.memory_audit(MemoryAuditQuery { key: key(""), operation: "evict".into(), ..MemoryAuditQuery::default() }).await?.entries;
    assert_eq!(evictions.len(), 1);
    let future = service
        .memory_audit(MemoryAuditQuery { key: key(""), since: "2999-01-01T00:00:00.000Z".into(), ..MemoryAuditQuery::default() })
        .await?;
    assert!(future.entries.is_empty());
    let stats = service.memory_stats(MemoryStatsRequest { key: key(""), since: String::new() }).await?;
    let count = |operation: &str| stats.counts.iter().find(|count| count.operation == operation).map(|count| count.count);
    assert_eq!((count("append"), count("evict"), count("pin"), count("delete")), (Some(101), Some(1), Some(52), Some(1)));

    service.add_memory(add("card 4111 1111 1111 1111 on file".into(), "human", false)).await?;
    let report = service.memory_compliance(MemoryKey { tenant_id: "t1".into(), memory_key: String::new() }).await?;
    assert_eq!(report.violations.len(), 1);
    assert_eq!(report.violations[0].issues, ["possible_card_number"]);
    assert!(!report.violations[0].fact_preview.contains("4111"));
    Ok(())
}

on_both_engines!(
    memory_evicts_protects_pins_and_audits,
    versions_environments_and_archiving,
    ab_tests_split_renders_and_report,
    evaluations_are_scored_and_kept,
    datasets_hold_items_in_order_and_import_once,
);
